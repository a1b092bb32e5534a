"""The one numerics harness: compare any outputs with a reference's, per output, worst case over inputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from aotforge.compiler.source import Arrays


@dataclasses.dataclass(frozen=True)
class OutputMetrics:
    max_abs: float
    rel_l2: float
    cosine: float


def compare(reference: Arrays, got: Arrays) -> dict[str, OutputMetrics]:
    """Per-output max-abs, relative L2 and cosine; a missing or reshaped output is infinitely wrong."""
    metrics = {}
    for name, ref in reference.items():
        out = got.get(name)
        if out is None or np.shape(out) != np.shape(ref):
            metrics[name] = OutputMetrics(float("inf"), float("inf"), 0.0)
            continue
        r = np.asarray(ref, dtype=np.float64).ravel()
        o = np.asarray(out, dtype=np.float64).ravel()
        diff = o - r
        ref_norm, out_norm = float(np.linalg.norm(r)), float(np.linalg.norm(o))
        rel = float(np.linalg.norm(diff)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(diff))
        cos = float(r @ o) / (ref_norm * out_norm) if ref_norm > 0 and out_norm > 0 else float(ref_norm == out_norm)
        metrics[name] = OutputMetrics(float(np.max(np.abs(diff))) if diff.size else 0.0, rel, cos)
    return metrics


def worst(runs: Sequence[dict[str, OutputMetrics]]) -> dict[str, OutputMetrics]:
    """The worst figure per output and metric over several input sets."""
    names = runs[0].keys()
    return {
        n: OutputMetrics(
            max(r[n].max_abs for r in runs), max(r[n].rel_l2 for r in runs), min(r[n].cosine for r in runs)
        )
        for n in names
    }


def compare_many(
    reference: Callable[[Arrays], Arrays], candidate: Callable[[Arrays], Arrays], inputs: Sequence[Arrays]
) -> dict[str, OutputMetrics]:
    return worst([compare(reference(x), candidate(x)) for x in inputs])
