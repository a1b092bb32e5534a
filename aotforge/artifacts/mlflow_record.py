"""What a push tells MLflow about an artifact: the run's name, params and numeric metrics, read from its manifest.

Kept apart from the client (``artifacts.mlflow_registry``) so the rules are plain functions:

- one registered model per model and target: ``NAME-TARGET`` (:func:`registered_name`), so
  ``mini_resnet-onnxruntime@prod`` says which target it is;
- the run is named after the build, ``NAME-vVERSION-TARGET`` (VERSION: the artifact's own, local one);
- params: target, passes, target options, toolchain, tolerance; metrics: latency percentiles,
  throughput, memory, validation rel L2 / cosine / max abs per output, validation passed (1/0), size.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aotforge.artifacts.manifest import Manifest

#: MLflow's limit on a param value.
_PARAM_MAX = 6000
_BENCH_METRICS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "throughput_per_s", "peak_rss_mb", "runner_rss_mb")
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")


def registered_name(manifest: Manifest) -> str:
    """The registered model of an artifact: its name and target, ``mini_resnet-onnxruntime``."""
    return f"{manifest.name}-{manifest.target.name}"


def run_name(manifest: Manifest) -> str:
    return f"{manifest.name}-v{manifest.version}-{manifest.target.name}"


def run_params(manifest: Manifest) -> dict[str, str]:
    params = {
        "name": manifest.name,
        "artifact_version": str(manifest.version),
        "target": manifest.target.name,
        "passes": ",".join(p["name"] for p in manifest.passes) or "none",
        "tolerance": str(manifest.validation.get("tolerance")),
    }
    for p in manifest.passes:
        if p.get("params"):
            params[f"pass.{p['name']}"] = json.dumps(p["params"], sort_keys=True)
    params |= {
        f"target.{k}": json.dumps(v) if not isinstance(v, str) else v for k, v in manifest.target.options.items()
    }
    params |= {f"toolchain.{k}": str(v) for k, v in manifest.toolchain.items()}
    return {_key(k): v[:_PARAM_MAX] for k, v in params.items()}


def run_metrics(manifest: Manifest, artifact_dir: Path) -> dict[str, float]:
    """Every figure of the manifest as a number (MLflow metrics are floats; tags stay for strings)."""
    v, b = manifest.validation, manifest.benchmark or {}
    metrics: dict[str, float] = {"validation_passed": 1.0 if v.get("passed") else 0.0}
    for output, figures in v.get("metrics", {}).items():
        for key in ("rel_l2", "cosine", "max_abs"):
            if isinstance(figures.get(key), (int, float)):
                metrics[f"validation.{output}.{key}"] = float(figures[key])
    if isinstance(v.get("token_agreement"), (int, float)):
        metrics["validation.token_agreement"] = float(v["token_agreement"])
    metrics |= {k: float(b[k]) for k in _BENCH_METRICS if isinstance(b.get(k), (int, float))}
    gen = b.get("generation") or {}
    metrics |= {f"itl_{q}_ms": float(x) for q, x in (gen.get("itl_ms") or {}).items() if isinstance(x, (int, float))}
    metrics |= {f"ttft_ms.prompt_{n}": float(x) for n, x in (gen.get("ttft_ms") or {}).items()}
    metrics |= {f"tokens_per_s.batch_{n}": float(x) for n, x in (gen.get("tokens_per_s") or {}).items()}
    size = sum(p.stat().st_size for p in artifact_dir.rglob("*") if p.is_file())
    metrics["model_size_mb"] = round(size / 1e6, 3)
    return {_key(k): x for k, x in metrics.items()}


def figures_from_metrics(metrics: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (validation, benchmark) parts of a manifest that :mod:`artifacts.promotion` reads, from run metrics."""
    outputs: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        output, _, stat = key.removeprefix("validation.").rpartition(".")
        if key.startswith("validation.") and output:
            outputs.setdefault(output, {})[stat] = value
    validation = {"passed": metrics.get("validation_passed") == 1.0, "metrics": outputs}
    bench = {k: metrics[k] for k in _BENCH_METRICS if k in metrics}
    return validation, bench


def _key(key: str) -> str:
    """An MLflow-safe metric / param key (alphanumerics, ``_ - . / space``)."""
    return _UNSAFE.sub("_", key)[:250]
