"""Static INT8 quantization to QDQ through ONNX Runtime, calibrated on user data or seeded noise.

Weights get per-channel int8 scales, activations per-tensor ones from the calibration method. The
calibration set is a directory of ``.npz`` files (one array per graph input, by name) or ``.npy``
files (single-input models); an array with one more axis than its input is a stack of samples.
Without a directory, seeded random inputs stand in (fine for tests, poor for accuracy).
Graphs already holding QDQ (from QAT) pass through untouched.

Activations default to uint8 (U8S8, MLAS's fast path on x86). With int8 activations ONNX Runtime
1.32's CPU optimizer left every Conv reading a ResNet block input (the output of a residual Add or
the stem's MaxPool) a float Conv between DQ and Q, 11 of 20, and no Add became QLinearAdd (1.3-1.5x
over fp32); neither ``DedicatedQDQPair`` (a DQ per reader) nor symmetric activations changed that.
uint8 activations fused all 20 Convs and the 8 Adds (2x). Pick int8 for QDQ consumers that need it.

With ``min_cosine`` set, the pass measures the mean output cosine against the fp32 model on
held-out inputs (calibration files past ``samples``, else seeded noise with another seed); below
the budget it ranks the quantized nodes by the error they add and excludes the worst, one at a
time, re-quantizing until the budget holds or ``max_exclusions`` is spent (then it fails).
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnx_ir.passes
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from aotforge.core.errors import OptionsError, PassFailedError
from aotforge.passes.base import GraphPass
from aotforge.passes.ort_quantization import op_counts, quantize_through_files
from aotforge.passes.quantization_debug import copy_model, mean_cosine, rank_nodes

Feeds = dict[str, np.ndarray]


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
    nodes_to_exclude: tuple[str, ...] = ()
    #: Random samples drawn without a directory, and the most files read from one.
    samples: int = 16
    seed: int = 0
    #: Accuracy budget: least mean output cosine vs fp32 on held-out inputs; 0 turns it off.
    min_cosine: float = 0.0
    #: Most nodes the budget may exclude from quantization before the pass fails.
    max_exclusions: int = 16
    #: Held-out inputs the budget is measured on.
    eval_samples: int = 8

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
        fp32 = copy_model(model) if p.min_cosine > 0 else None
        self._quantize(model, samples, list(p.nodes_to_exclude))
        budget = self._meet_budget(model, fp32, samples, held_out) if fp32 is not None else {}
        excluded = list(p.nodes_to_exclude) + budget.get("exclusions", [])
        quantized = _quantized_nodes(model, set(excluded))
        self.stats = {
            "nodes_quantized": len(quantized),
            "ops": {op: sum(1 for q in quantized if q == op) for op in sorted(set(quantized))},
            "qdq_nodes": sum(op_counts(model).values()),
            "activations": p.activations.value,
            "excluded": excluded,
            "calibration_samples": len(samples),
            "calibration_source": p.calibration_dir or f"random (seed {p.seed})",
        }
        if budget:
            self.stats["accuracy_budget"] = budget
        return onnx_ir.passes.PassResult(model, modified=len(model.graph) != before)

    def _samples(self, model: ir.Model) -> tuple[list[Feeds], list[Feeds]]:
        """Calibration feeds and, when the budget is on, held-out feeds distinct from them."""
        p = self.params
        extra = p.eval_samples if p.min_cosine > 0 else 0
        loaded = load_samples(model, p.calibration_dir, p.samples + extra) if p.calibration_dir else []
        samples, held_out = loaded[: p.samples], loaded[p.samples :]
        samples = samples or random_samples(model, p.samples, p.seed)
        if extra and not held_out:
            held_out = random_samples(model, extra, p.seed + 1_000_003)
        return samples, held_out

    def _quantize(
        self, model: ir.Model, samples: list[Feeds], exclude: list[str], source: ir.Model | None = None
    ) -> None:
        p = self.params

        def quantize(src: Path, dst: Path) -> None:
            quantize_static(
                src,
                dst,
                _Reader(samples),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(p.op_types) or None,
                per_channel=p.per_channel,
                activation_type=_ORT_ACTIVATION[p.activations],
                weight_type=QuantType.QInt8,
                nodes_to_exclude=exclude,
                calibrate_method=_ORT_METHOD[p.method],
                extra_options={
                    "ActivationSymmetric": p.symmetric,
                    "WeightSymmetric": True,
                    "QuantizeBias": p.quantize_bias,
                },
            )

        quantize_through_files(model, quantize, source)

    def _meet_budget(self, model: ir.Model, fp32: ir.Model, samples: list[Feeds], held_out: list[Feeds]) -> dict:
        """Exclude the worst-ranked nodes until the held-out cosine reaches ``min_cosine``; fail if it cannot."""
        p = self.params
        cos = first = mean_cosine(fp32, model, held_out)
        exclusions: list[str] = []
        ranking = [] if cos >= p.min_cosine else rank_nodes(fp32, model, held_out, _quantized_names(model, p))
        for name, _ in ranking[: p.max_exclusions]:
            if cos >= p.min_cosine:
                break
            exclusions.append(name)
            self._quantize(model, samples, [*p.nodes_to_exclude, *exclusions], fp32)
            cos = mean_cosine(fp32, model, held_out)
        top = [{"node": n, "error": e} for n, e in ranking[:10]]
        if cos < p.min_cosine:
            listed = ", ".join(f"{r['node']} ({r['error']:.4g})" for r in top)
            raise PassFailedError(
                f"pass int8: mean cosine vs fp32 is {cos:.5f} after excluding {exclusions}, below the budget "
                f"{p.min_cosine}; nodes by added error: {listed or 'none quantized'}; raise max_exclusions "
                "or lower min_cosine"
            )
        return {
            "min_cosine": p.min_cosine,
            "cosine_before": round(first, 6),
            "cosine_after": round(cos, 6),
            "eval_samples": len(held_out),
            "ranking": top,
            "exclusions": exclusions,
        }


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


def _quantized_names(model: ir.Model, params: QuantizeStaticParams) -> list[str]:
    """Names of nodes that read a DequantizeLinear output and are not excluded."""
    names = []
    for node in model.graph:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.name in params.nodes_to_exclude:
            continue
        producers = [v.producer() for v in node.inputs if v is not None]
        if any(q is not None and q.op_type == "DequantizeLinear" for q in producers):
            names.append(str(node.name))
    return names


def load_samples(model: ir.Model, source: Path | str, limit: int) -> list[Feeds]:
    """Calibration feeds from a directory of .npz / .npy files or ``module.py:function``."""
    from aotforge.core.calibration import load_calibration

    inputs = {
        str(v.name): (len(v.shape) if v.shape is not None else -2, v.dtype.numpy() if v.dtype is not None else None)
        for v in model.graph.inputs
        if v.name not in model.graph.initializers
    }
    try:
        return load_calibration(str(source), inputs, limit)
    except OptionsError as e:
        raise OptionsError(f"pass int8: {e}") from e


def random_samples(model: ir.Model, count: int, seed: int) -> list[Feeds]:
    """Seeded feeds of each input's shape (dynamic dims as 1): normal floats, 0/1 integers."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        feeds = {}
        for value in model.graph.inputs:
            if value.name in model.graph.initializers or value.name is None:
                continue
            shape = [d if isinstance(d, int) else 1 for d in (value.shape or ())]
            dtype = value.dtype.numpy() if value.dtype is not None else np.dtype(np.float32)
            if np.issubdtype(dtype, np.floating):
                feeds[value.name] = rng.standard_normal(shape).astype(dtype)
            else:
                feeds[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
        samples.append(feeds)
    return samples
