"""The comparison of a farm's artifacts: ``matrix.json``, ``matrix.md`` and ``matrix.png``.

One row per model x target: p50 / p99 latency and their spread, the validation error against the
source model, the worst disagreement with the model's other targets (every pair of artifacts run on
the same validation inputs, max relative L2), the artifact's size and its build seconds.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.debris import make_temp_file

COLUMNS = (
    ("model", "model"),
    ("target", "target"),
    ("status", "status"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("spread_pct", "spread %"),
    ("validation_rel_l2", "validation rel L2"),
    ("agreement_rel_l2", "agreement rel L2"),
    ("size_mb", "size MB"),
    ("build_s", "build s"),
    ("host", "worker"),
)


def artifact_row(model: str, target: str, path: Path, manifest: Mapping[str, Any], *, cached: bool) -> dict:
    """A row from a stored artifact's manifest."""
    bench = manifest.get("benchmark") or {}
    metrics = manifest["validation"].get("metrics", {})
    build = manifest.get("build", {})
    p50, p99 = bench.get("p50_ms"), bench.get("p99_ms")
    return {
        "model": model,
        "target": target,
        "status": "cached" if cached else "ok",
        "p50_ms": p50,
        "p99_ms": p99,
        # How far the tail sits above the median: what a p50 alone hides.
        "spread_pct": round(100.0 * (p99 - p50) / p50, 1) if p50 and p99 is not None else None,
        "validation_rel_l2": max((m["rel_l2"] for m in metrics.values()), default=None),
        "agreement_rel_l2": None,
        "size_mb": round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 2),
        "build_s": build.get("seconds"),
        "host": (build.get("worker") or {}).get("host", build.get("host")),
        "path": str(path),
        "ir_sha256": manifest["ir"]["sha256"],
        "files": dict(manifest.get("files", {})),
        "toolchain": dict(manifest.get("toolchain", {})),
        "worker": dict(build.get("worker") or {}),
    }


def failed_row(model: str, target: str, reason: str) -> dict[str, Any]:
    return {"model": model, "target": target, "status": "failed", "error": reason}


def agreement(outputs: Mapping[str, Path]) -> dict[str, float]:
    """Max relative L2 between every pair of targets' outputs on the same inputs: ``{"a~b": value}``."""
    loaded = {}
    for target, path in outputs.items():
        with np.load(path, allow_pickle=False) as data:
            loaded[target] = {k: np.asarray(data[k], dtype=np.float64) for k in data.files}
    pairs: dict[str, float] = {}
    for a, b in itertools.combinations(sorted(loaded), 2):
        worst = 0.0
        for key in sorted(set(loaded[a]) & set(loaded[b])):
            x, y = loaded[a][key], loaded[b][key]
            if x.shape != y.shape:
                worst = float("inf")
                continue
            scale = max(float(np.linalg.norm(x)), float(np.linalg.norm(y)), 1e-12)
            worst = max(worst, float(np.linalg.norm(x - y)) / scale)
        pairs[f"{a}~{b}"] = worst
    return pairs


def fill_agreement(rows: list[dict[str, Any]], pairs: Mapping[str, float]) -> None:
    """Each row's worst agreement with the same model's other targets."""
    for row in rows:
        mine = [v for pair, v in pairs.items() if row["target"] in pair.split("~")]
        if mine and row["status"] != "failed":
            row["agreement_rel_l2"] = max(mine)


def markdown(rows: Sequence[Mapping[str, Any]], agreements: Mapping[str, Mapping[str, float]]) -> str:
    """The rows as a Markdown table, then every pair's agreement and every failure's reason."""
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(k)) for k, _ in COLUMNS) + " |")
    pairs = [f"- {m}: {p} max rel L2 {_cell(v)}" for m, ps in agreements.items() for p, v in ps.items()]
    if pairs:
        lines += ["", "Cross-target agreement (every pair of artifacts on the same validation inputs):", *pairs]
    failures = [f"- {r['model']} / {r['target']}: {r['error']}" for r in rows if r["status"] == "failed"]
    if failures:
        lines += ["", "Failed:", *failures]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def write(directory: Path, summary: Mapping[str, Any]) -> dict[str, Path]:
    """``matrix.json``, ``matrix.md`` and ``matrix.png`` in ``directory`` (each written whole, then renamed)."""
    directory.mkdir(parents=True, exist_ok=True)
    rows, agreements = summary["rows"], summary["agreement"]
    files = {"json": directory / "matrix.json", "md": directory / "matrix.md", "png": directory / "matrix.png"}
    _atomic(files["json"], json.dumps(summary, indent=2, sort_keys=True, default=str).encode() + b"\n")
    _atomic(files["md"], markdown(rows, agreements).encode())
    tmp = make_temp_file(directory, ".matrix-", ".png")
    try:
        chart(rows, tmp)
        tmp.replace(files["png"])
    finally:
        tmp.unlink(missing_ok=True)
    return files


def _atomic(path: Path, data: bytes) -> None:
    tmp = make_temp_file(path.parent, ".matrix-")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def chart(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """p50 bars with a line up to p99 per model x target, and the artifact sizes beside them."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a build host
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] != "failed" and r.get("p50_ms") is not None]
    labels = [f"{r['model']}\n{r['target']}" for r in done] or ["(no benchmarked artifact)"]
    p50 = [r["p50_ms"] for r in done] or [0.0]
    p99 = [r["p99_ms"] for r in done] or [0.0]
    y = np.arange(len(labels))
    fig, (lat, size) = plt.subplots(1, 2, figsize=(10, 1.2 + 0.55 * len(labels)), sharey=True)
    lat.barh(y, p50, color="#4c72b0", label="p50")
    lat.errorbar(p50, y, xerr=[np.zeros(len(p50)), np.subtract(p99, p50)], fmt="none", ecolor="black", capsize=3)
    lat.set_yticks(y, labels, fontsize=8)
    lat.invert_yaxis()
    lat.set_xlabel("latency ms (bar: p50, whisker: p99)")
    size.barh(y, [r.get("size_mb") or 0.0 for r in done] or [0.0], color="#55a868")
    size.set_xlabel("artifact size MB")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
