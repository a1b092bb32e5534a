"""The accuracy-budget search both INT8 passes share: try quantization methods, then exclusions.

A pass lists its methods (per-channel weights, activation type, smoothing and its alpha, static
or dynamic), fastest first, and a function that quantizes a fresh copy of the prepared fp32 graph
with one method and a set of node exclusions. Each method is measured on held-out inputs (never
calibrated on): per sample, the least cosine over the graph outputs against fp32. The first that
holds the budget wins. When none does, the quantized nodes of the best one are ranked by the error
each adds (measured on calibration inputs, see passes/quantization_debug.py) and kept float, worst
first, until the budget holds or ``max_exclusions`` is spent; then the pass fails with the methods
tried, the best cosine reached and the ranking. ONNX Runtime does the quantizing; this is glue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.core.errors import PassFailedError
from aotforge.passes.quantization_debug import Feeds, rank_nodes, sample_cosines

#: The search smooths only nodes whose peak input channel is this many times the median one: the
#: outlier-carrying inputs (post-LayerNorm / GELU in BERT) gain, the others would pay a Mul for nothing.
SEARCH_MIN_RATIO = 5.0


@dataclasses.dataclass(frozen=True)
class Method:
    """One way to quantize: what the manifest records as the pass's choice."""

    kind: str  # "static" (QDQ, calibrated activation scales) or "dynamic" (activation scales at run time)
    per_channel: bool
    activations: str = ""  # static only: "uint8" or "int8"
    smooth_alpha: float = 0.0
    smooth_min_ratio: float = 0.0

    def record(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if v != "" and not (k.startswith("smooth") and not v)}
        return dict(sorted(out.items()))

    def label(self) -> str:
        parts = [self.kind, "per-channel" if self.per_channel else "per-tensor"]
        parts += [f"{self.activations} activations"] if self.activations else []
        parts += [f"smooth {self.smooth_alpha:g} (ratio {self.smooth_min_ratio:g})"] if self.smooth_alpha else []
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Budget:
    """Least mean and least per-sample cosine vs fp32; 0 turns either off."""

    mean: float
    least: float = 0.0

    def holds(self, cos: list[float]) -> bool:
        return float(np.mean(cos)) >= self.mean and min(cos) >= self.least

    def text(self) -> str:
        return f"mean {self.mean}" + (f", min {self.least}" if self.least else "")


#: quantize(method, exclusions) -> a quantized copy of the prepared fp32 graph.
Quantize = Callable[[Method, list[str]], ir.Model]


def summary(cos: list[float]) -> dict[str, float]:
    return {"mean": round(float(np.mean(cos)), 6), "min": round(float(np.min(cos)), 6)}


def search(
    what: str,
    fp32: ir.Model,
    methods: list[Method],
    quantize: Quantize,
    data: tuple[list[Feeds], list[Feeds]],
    budget: Budget,
    max_exclusions: int,
) -> tuple[ir.Model, dict[str, Any]]:
    """The first method (plus exclusions) holding ``budget`` on the held-out feeds and its record; else fail.

    ``data`` is (calibration feeds, held-out feeds): the ranking is measured on the first, the
    budget on the second.
    """
    calibration, held_out = data
    tried: list[dict[str, Any]] = []
    best: tuple[float, Method, ir.Model, list[float]] | None = None
    for method in methods:
        model = quantize(method, [])
        cos = sample_cosines(fp32, model, held_out)
        tried.append({"method": method.label(), **summary(cos)})
        if budget.holds(cos):
            return model, _record(method, tried, cos, [], [], budget, len(held_out))
        if best is None or np.mean(cos) > best[0]:
            best = (float(np.mean(cos)), method, model, cos)
    assert best is not None, "search needs at least one method"
    _, method, model, cos = best
    ranking = rank_nodes(fp32, model, calibration[:16], quantized_names(fp32, model))
    exclusions: list[str] = []
    for name, _ in ranking[:max_exclusions]:
        exclusions.append(name)
        model = quantize(method, exclusions)
        cos = sample_cosines(fp32, model, held_out)
        tried.append({"method": f"{method.label()}, {len(exclusions)} float", **summary(cos)})
        if budget.holds(cos):
            return model, _record(method, tried, cos, exclusions, ranking, budget, len(held_out))
    top = ", ".join(f"{n} ({e:.4g})" for n, e in ranking[:10]) or "none quantized"
    reached = max(tried, key=lambda t: t["mean"])
    runs = "; ".join(f"{t['method']}: {t['mean']}/{t['min']}" for t in tried)
    raise PassFailedError(
        f"pass {what}: no method holds the accuracy budget ({budget.text()} cosine vs fp32 on {len(held_out)} "
        f"held-out inputs); best reached: mean {reached['mean']}, min {reached['min']} ({reached['method']}); "
        f"tried (mean/min): {runs}; nodes of the best method by added error: {top}. Calibrate on more "
        "representative data, raise max_exclusions, or lower the budget"
    )


def _record(
    method: Method,
    tried: list[dict[str, Any]],
    cos: list[float],
    exclusions: list[str],
    ranking: list[tuple[str, float]],
    budget: Budget,
    held_out: int,
) -> dict[str, Any]:
    return {
        "chosen": method.record(),
        "budget": {"mean": budget.mean, "min": budget.least},
        "held_out": {**summary(cos), "samples": held_out},
        "tried": tried,
        "exclusions": exclusions,
        "ranking": [{"node": n, "error": e} for n, e in ranking[:10]],
    }


def quantized_names(fp32: ir.Model, quantized: ir.Model) -> list[str]:
    """fp32 nodes the quantizer rewrote (gone, or another op under the name) or fed from a DequantizeLinear."""
    by_name = {str(n.name): n for n in quantized.graph}
    names = []
    for node in fp32.graph:
        got = by_name.get(str(node.name))
        if got is None or got.op_type != node.op_type or any(_dequantized(v) for v in got.inputs):
            names.append(str(node.name))
    return names


def _dequantized(value: ir.Value | None) -> bool:
    producer = value.producer() if value is not None else None
    return producer is not None and producer.op_type == "DequantizeLinear"
