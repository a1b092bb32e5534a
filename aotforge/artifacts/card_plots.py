"""The model card's plots, rendered at build time into ``plots/`` of the artifact (hashed like every file).

- ``latency.png``: the distribution of the benchmark's timed calls (needs the calls: the build's tail
  writes it, :func:`latency_plot`);
- ``accuracy.png``: rel L2 and cosine against the source model per output;
- ``quant_layers.png``: the quantized nodes ranked by the error they add (the int8 / int8-dynamic
  passes' accuracy-budget search measures it);
- ``generation.png``: inter-token latency by position and time to first token by prompt length
  (``benchmark.generation`` of a generative build).

matplotlib is optional (``aotforge[plots]``): without it no plot is drawn and the card says so. The
figures use the Agg canvas directly (no pyplot state) and PNGs carry no timestamp or version text,
so plots of the same figures are the same bytes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLOTS_DIR = "plots"


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _figure(width: float = 6.4, height: float = 3.6) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, stage: Path, name: str) -> str:
    (stage / PLOTS_DIR).mkdir(exist_ok=True)
    fig.savefig(stage / PLOTS_DIR / name, format="png", metadata={"Software": None})
    return f"{PLOTS_DIR}/{name}"


def latency_plot(stage: Path, times_ms: Sequence[float], bench: Mapping[str, Any]) -> str | None:
    """A histogram of the timed calls with p50 / p90 / p99 marked."""
    if not available() or not times_ms:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    ax.hist(times_ms, bins=min(50, max(10, len(times_ms) // 5)), color="#4c72b0")
    for key, style in (("p50_ms", "-"), ("p90_ms", "--"), ("p99_ms", ":")):
        if key in bench:
            ax.axvline(bench[key], color="black", linestyle=style, label=f"{key[:3]} {bench[key]:.3g} ms")
    ax.set(
        xlabel="latency per call (ms)", ylabel="calls", title=f"latency, {len(times_ms)} calls, batch {bench['batch']}"
    )
    ax.legend()
    return _save(fig, stage, "latency.png")


def manifest_plots(stage: Path, validation: Mapping[str, Any], benchmark: Mapping[str, Any] | None,
                   passes: Sequence[Mapping[str, Any]]) -> list[str]:  # fmt: skip
    """The plots drawn from the manifest's own figures (accuracy, quantized-layer ranking, generation)."""
    if not available():
        return []
    drawn = [_accuracy(stage, validation.get("metrics") or {}), _ranking(stage, passes)]
    drawn.append(_generation(stage, (benchmark or {}).get("generation") or {}))
    return [d for d in drawn if d]


def _accuracy(stage: Path, metrics: Mapping[str, Mapping[str, float]]) -> str | None:
    if not metrics:
        return None
    names = sorted(metrics)
    fig = _figure(6.4, 1.2 + 0.35 * len(names))
    left, right = fig.subplots(1, 2, sharey=True)
    rel = [max(float(metrics[n].get("rel_l2", 0.0)), 1e-12) for n in names]
    left.barh(names, rel, color="#c44e52")
    left.set(xscale="log", xlabel="rel L2 vs source (log)")
    right.barh(names, [1.0 - float(metrics[n].get("cosine", 1.0)) + 1e-12 for n in names], color="#55a868")
    right.set(xscale="log", xlabel="1 - cosine vs source (log)")
    fig.suptitle("accuracy against the source model, per output")
    return _save(fig, stage, "accuracy.png")


def _ranking(stage: Path, passes: Sequence[Mapping[str, Any]]) -> str | None:
    ranking = [r for p in passes for r in ((p.get("stats") or {}).get("accuracy_budget") or {}).get("ranking", [])]
    if not ranking:
        return None
    ranking = sorted(ranking, key=lambda r: -float(r["error"]))[:15][::-1]
    fig = _figure(6.4, 1.2 + 0.3 * len(ranking))
    ax = fig.add_subplot()
    ax.barh([str(r["node"])[-40:] for r in ranking], [float(r["error"]) for r in ranking], color="#8172b2")
    ax.set(xlabel="cosine drop the node adds (fp32 vs quantized)", title="quantized nodes by added error")
    return _save(fig, stage, "quant_layers.png")


def _generation(stage: Path, gen: Mapping[str, Any]) -> str | None:
    itl = gen.get("itl_by_position_ms") or []
    ttft = gen.get("ttft_ms") or {}
    if not itl and not ttft:
        return None
    fig = _figure(8.0, 3.4)
    left, right = fig.subplots(1, 2)
    left.plot(range(1, len(itl) + 1), itl, marker=".", color="#4c72b0")
    left.set(xlabel="decode step", ylabel="ms", title=f"inter-token latency (prompt {gen.get('itl_prompt_len')})")
    lengths = sorted(ttft, key=lambda n: int(n))
    right.bar([str(n) for n in lengths], [float(ttft[n]) for n in lengths], color="#dd8452")
    right.set(xlabel="prompt tokens", ylabel="ms", title="time to first token")
    return _save(fig, stage, "generation.png")
