"""Promotion gates: an alias moves to a version only if its validation passed and the user's thresholds hold.

The gates read the figures a registry keeps beside the version when it has a ``figures(entry)`` method
(MLflow: the run's metrics, nothing downloaded); otherwise the manifest it stores (pulled and hash-verified).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotforge.artifacts.local_registry import Registry, parse_ref
from aotforge.artifacts.manifest import read_manifest
from aotforge.core.errors import PromotionRefusedError


@dataclasses.dataclass(frozen=True)
class Gates:
    """Thresholds an artifact must meet to take an alias; ``None`` means the gate is not checked."""

    min_cosine: float | None = None
    max_p50_ms: float | None = None
    max_p99_ms: float | None = None


def failed_gates(validation: Mapping[str, Any], bench: Mapping[str, Any], gates: Gates) -> list[str]:
    """Each failed gate as 'gate: measured X, required Y'; empty when the artifact may be promoted.

    ``validation`` and ``bench`` are the manifest's sections (or the same figures a registry keeps).
    """
    failures: list[str] = []
    if validation.get("passed") is not True:
        failures.append(f"validation: passed={validation.get('passed')!r}, required True")
    if gates.min_cosine is not None:
        cosines = [m["cosine"] for m in validation.get("metrics", {}).values() if "cosine" in m]
        worst = min(cosines) if cosines else None
        if worst is None or worst < gates.min_cosine:
            failures.append(f"min-cosine: measured {_fmt(worst)}, required >= {gates.min_cosine}")
    for key, limit in (("p50_ms", gates.max_p50_ms), ("p99_ms", gates.max_p99_ms)):
        if limit is None:
            continue
        measured = bench.get(key)
        if measured is None or float(measured) > limit:
            failures.append(f"max-{key.replace('_', '-')}: measured {_fmt(measured)}, required <= {limit}")
    return failures


def _fmt(value: object) -> str:
    return "nothing (no benchmark/validation recorded)" if value is None else f"{value:.6g}"


def promote(registry: Registry, ref: str, alias: str, gates: Gates) -> tuple[str, int]:
    """Point ``alias`` at ``ref`` (NAME:VERSION) if every gate holds; else raise naming each failed gate."""
    parse_ref(ref)  # a NAME@ALIAS ref is allowed too: it resolves to the version the alias names now
    entry = registry.resolve(ref)
    figures = getattr(registry, "figures", None)
    if figures is not None:  # the registry keeps the figures (MLflow: the run's metrics): no download
        validation, bench = figures(entry)
    else:
        with tempfile.TemporaryDirectory(prefix="aotforge-promote-") as tmp:
            manifest = read_manifest(registry.pull(entry.ref, Path(tmp) / "artifact"))
        validation, bench = manifest.validation, manifest.benchmark or {}
    failures = failed_gates(validation, bench, gates)
    if failures:
        raise PromotionRefusedError(
            f"refused to move {entry.name}@{alias} to {entry.ref}: "
            + "; ".join(failures)
            + " (rebuild with better settings, or relax the threshold)"
        )
    registry.set_alias(entry.name, alias, entry.version)
    return entry.name, entry.version
