"""Static INT8 quantization to QDQ through ONNX Runtime, calibrated on user data or seeded noise.

Weights get per-channel int8 scales, activations per-tensor ones from the calibration method. The
calibration set is a directory of ``.npz`` files (one array per graph input, by name) or ``.npy``
files (single-input models); an array with one more axis than its input is a stack of samples.
Without a directory, seeded random inputs stand in (fine for tests, poor for accuracy).
Graphs already holding QDQ (from QAT) pass through untouched.

Activations default to uint8 (U8S8, MLAS's fast path on x86). With int8 activations ONNX Runtime
1.32's CPU optimizer left every Conv reading a ResNet block input (the output of a residual Add or
the stem's MaxPool) a float Conv between DQ and Q, 11 of 20, and no Add became QLinearAdd; neither
``DedicatedQDQPair`` (a DQ per reader) nor symmetric activations changed that. uint8 activations fused
all 20 Convs and the 8 Adds, and ran much faster (docs/benchmarks.md). Pick int8 for QDQ consumers that need it.

With ``min_cosine`` (and ``min_sample_cosine``) set, the pass searches (passes/quantization_search.py):
the configured method, the other activation type, per-channel weights, SmoothQuant smoothing at each
``search_alphas``, and for MatMul-heavy graphs (transformers) dynamic quantization, plain and smoothed;
each measured on held-out inputs (calibration files past ``samples``, else seeded noise with another
seed). When none holds, the best one's nodes are kept float by measured sensitivity, worst first,
up to ``max_exclusions``; then the pass fails with the ranking and the best cosine reached. The
manifest records the method chosen (``method``) and the search (``accuracy_budget``).
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import onnx_ir as ir
import onnx_ir.passes
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from aotforge.core.errors import OptionsError
from aotforge.passes import quantize_prepare as prep
from aotforge.passes.base import GraphPass
from aotforge.passes.calibration_feeds import load_samples, random_samples
from aotforge.passes.integer_range import IntegerWeights, integer_weights
from aotforge.passes.ort_quantization import (
    QUANTIZED_OPS,
    adopt,
    op_counts,
    ort_weight_options,
    quantize_dynamic_int8,
    quantize_through_files,
    split_held_out,
)
from aotforge.passes.quantization_debug import Feeds, copy_model
from aotforge.passes.quantization_search import SEARCH_MIN_RATIO, Budget, Method, search


class Calibration(enum.StrEnum):
    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class Activations(enum.StrEnum):
    UINT8 = "uint8"
    INT8 = "int8"


_ORT_ACTIVATION = {Activations.UINT8: QuantType.QUInt8, Activations.INT8: QuantType.QInt8}

_ORT_METHOD = {
    Calibration.MINMAX: CalibrationMethod.MinMax,
    Calibration.ENTROPY: CalibrationMethod.Entropy,
    Calibration.PERCENTILE: CalibrationMethod.Percentile,
}


@dataclasses.dataclass(frozen=True)
class QuantizeStaticParams:
    #: Directory of .npz / .npy calibration samples or ``module.py:function``; empty uses seeded random inputs.
    calibration_dir: str = ""
    method: Calibration = Calibration.MINMAX
    per_channel: bool = True
    #: Symmetric activation ranges (zero point 0, 128 for uint8); weights are always symmetric int8.
    symmetric: bool = False
    #: Activation integer type: uint8 lets ORT's CPU optimizer fuse every Conv / Add (see the module doc).
    activations: Activations = Activations.UINT8
    #: Bias as int32 Q/DQ (ORT folds it into QLinearConv); TensorRT wants float bias instead.
    quantize_bias: bool = True
    #: Op types to quantize; empty means ONNX Runtime's default set.
    op_types: tuple[str, ...] = ()
    #: The weights' integer type: int8, int8-7bit (ONNX Runtime's reduce_range), uint8, or ``auto``: int8 where this
    #: CPU's integer GEMM is exact, uint8 where it saturates (x86-64 without VNNI; ``integer_range``).
    weights: IntegerWeights = IntegerWeights.AUTO
    nodes_to_exclude: tuple[str, ...] = ()
    #: Random samples drawn without a directory, and the most files read from one.
    samples: int = 16
    seed: int = 0
    #: Accuracy budget: least mean / least per-sample output cosine vs fp32 on held-out inputs; 0 turns it off.
    min_cosine: float = 0.0
    min_sample_cosine: float = 0.0
    #: Under a budget, try other methods (activation type, smoothing, dynamic) before exclusions.
    search: bool = True
    #: SmoothQuant strengths the search tries on graphs with MatMul weights.
    #: Strongest first: smoothing scales only outlier channels down (quantize_prepare.smooth); on a user MiniLM
    #: export 0.8 beat 0.5 on held-out sentences and on random token ids alike.
    search_alphas: tuple[float, ...] = (0.8, 0.5)
    #: Most nodes the budget may exclude from quantization before the pass fails.
    max_exclusions: int = 16
    #: Held-out inputs the budget is measured on (read after ``samples``).
    eval_samples: int = 32

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "method", Calibration(str(self.method).lower()))
        except ValueError:
            valid = ", ".join(c.value for c in Calibration)
            raise OptionsError(f"pass int8: calibration method {self.method!r} is unknown; use {valid}") from None
        try:
            object.__setattr__(self, "activations", Activations(str(self.activations).lower()))
        except ValueError:
            valid = ", ".join(a.value for a in Activations)
            raise OptionsError(f"pass int8: activations {self.activations!r} is unknown; use {valid}") from None
        integer_weights(self.weights, "pass int8")


class QuantizeStaticPass(GraphPass):
    name = "int8"
    Params = QuantizeStaticParams
    changes_numerics = True

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        p = self.params
        if op_counts(model):
            self.stats = {"nodes_quantized": 0, "skipped": "already quantized (QDQ or integer ops in the graph)"}
            return onnx_ir.passes.PassResult(model, modified=False)
        samples, held_out = self._samples(model)
        before = len(model.graph)
        configured = Method("static", p.per_channel, p.activations.value)
        record: dict[str, Any] = {}
        if p.min_cosine > 0 or p.min_sample_cosine > 0:
            fp32 = copy_model(model)
            budget = Budget(p.min_cosine, p.min_sample_cosine)
            methods = self._methods(model, configured)
            quantized, record = search(
                "int8",
                fp32,
                methods,
                lambda method, exclude: self._quantized(fp32, samples, method, exclude),
                (samples, held_out),
                budget,
                p.max_exclusions,
            )
        else:
            quantized = self._quantized(model, samples, configured, [])
        adopt(model, quantized)
        excluded = list(p.nodes_to_exclude) + record.get("exclusions", [])
        chosen = record.get("chosen", configured.record())
        if chosen["kind"] == "dynamic":
            ops = op_counts(model, QUANTIZED_OPS - {"DynamicQuantizeLinear"})
        else:
            found = _quantized_nodes(model, set(excluded))
            ops = {op: found.count(op) for op in sorted(set(found))}
        self.stats = {
            "method": chosen,
            "nodes_quantized": sum(ops.values()),
            "ops": ops,
            "qdq_nodes": sum(op_counts(model, frozenset({"QuantizeLinear", "DequantizeLinear"})).values()),
            "activations": chosen.get("activations", "dynamic uint8"),
            "excluded": excluded,
            "calibration_samples": len(samples),
            "calibration_source": p.calibration_dir or f"random (seed {p.seed})",
        }
        weights, why = self._weights(chosen["kind"], chosen.get("activations", ""))
        self.stats["weights"] = {"type": weights.value, "why": why}
        smoothed = prep.smoothed_nodes(model)
        if smoothed:
            self.stats["smoothed"] = {"alpha": chosen["smooth_alpha"], "nodes": len(smoothed), "names": smoothed}
        if record:
            self.stats["accuracy_budget"] = record
        return onnx_ir.passes.PassResult(model, modified=len(model.graph) != before)

    def _samples(self, model: ir.Model) -> tuple[list[Feeds], list[Feeds]]:
        """Calibration feeds and, when the budget is on, held-out feeds distinct from them."""
        p = self.params
        extra = p.eval_samples if p.min_cosine > 0 or p.min_sample_cosine > 0 else 0
        loaded = load_samples(model, p.calibration_dir, p.samples + extra) if p.calibration_dir else []
        samples, held_out = split_held_out(loaded, p.samples, extra) if extra else (loaded, [])
        samples = samples or random_samples(model, p.samples, p.seed)
        if extra and not held_out:
            held_out = random_samples(model, extra, p.seed + 1_000_003)
        return samples, held_out

    def _methods(self, model: ir.Model, configured: Method) -> list[Method]:
        """What the search tries, in order: QDQ variants first, then dynamic for MatMul-heavy graphs."""
        p = self.params
        if not p.search:
            return [configured]
        other = Activations.INT8 if p.activations == Activations.UINT8 else Activations.UINT8
        methods = [configured, dataclasses.replace(configured, activations=other.value)]
        per_channel = dataclasses.replace(configured, per_channel=True)
        methods.append(per_channel)
        smooth = [
            dataclasses.replace(per_channel, smooth_alpha=a, smooth_min_ratio=SEARCH_MIN_RATIO) for a in p.search_alphas
        ]
        methods += smooth if prep.smoothable(model) else []
        if _matmul_heavy(model):
            dynamic = Method("dynamic", True)
            methods.append(dynamic)
            methods += [
                dataclasses.replace(dynamic, smooth_alpha=m.smooth_alpha, smooth_min_ratio=m.smooth_min_ratio)
                for m in smooth
            ]
        return list(dict.fromkeys(methods))

    def _weights(self, kind: str, activations: str) -> tuple[IntegerWeights, str]:
        """The weights' integer type for a method of ``kind`` with ``activations`` on this CPU, and why."""
        signed = kind != "dynamic" and activations == Activations.INT8.value
        return integer_weights(self.params.weights, "pass int8", signed)

    def _quantized(self, fp32: ir.Model, samples: list[Feeds], method: Method, exclude: list[str]) -> ir.Model:
        """A copy of ``fp32`` quantized with ``method``, keeping ``exclude`` (and ``nodes_to_exclude``) float."""
        p = self.params
        model = copy_model(fp32)
        excluded = [*p.nodes_to_exclude, *exclude]
        if method.smooth_alpha:
            prep.smooth(model, samples, method.smooth_alpha, method.smooth_min_ratio, excluded)
        weights, _ = self._weights(method.kind, method.activations)
        if method.kind == "dynamic":
            quantize_dynamic_int8(model, method.per_channel, ("MatMul", "Gemm"), excluded, weights)
            return model

        def quantize(src: Path, dst: Path) -> None:
            quantize_static(
                src,
                dst,
                _Reader(samples),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(p.op_types) or None,
                per_channel=method.per_channel,
                activation_type=_ORT_ACTIVATION[Activations(method.activations)],
                **ort_weight_options(weights),
                nodes_to_exclude=excluded,
                calibrate_method=_ORT_METHOD[p.method],
                extra_options={
                    "ActivationSymmetric": p.symmetric,
                    "WeightSymmetric": True,
                    "QuantizeBias": p.quantize_bias,
                },
            )

        quantize_through_files(model, quantize)
        return model


def _matmul_heavy(model: ir.Model) -> bool:
    """More MatMul / Gemm nodes with a constant weight than Convs: dynamic quantization is worth a try."""
    weighted = sum(
        1
        for n in model.graph
        if n.op_type in ("MatMul", "Gemm")
        and len(n.inputs) > 1
        and n.inputs[1] is not None
        and n.inputs[1].const_value is not None
    )
    return weighted > sum(1 for n in model.graph if n.op_type == "Conv")


class _Reader(CalibrationDataReader):
    def __init__(self, samples: list[Feeds]) -> None:
        self._samples = iter(samples)

    def get_next(self) -> Feeds | None:
        return next(self._samples, None)


def _quantized_nodes(model: ir.Model, excluded: set[str]) -> list[str]:
    """Op types of nodes that read a DequantizeLinear output (ORT fuses them to int8 kernels), less excluded ones."""
    quantized = []
    for node in model.graph:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.name in excluded:
            continue
        producers = [v.producer() for v in node.inputs if v is not None]
        if any(p is not None and p.op_type == "DequantizeLinear" for p in producers):
            quantized.append(node.op_type)
    return quantized
