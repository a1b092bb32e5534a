"""Dynamic INT8 quantization through ONNX Runtime: int8 weights, activations quantized at run time.

Suits MatMul-heavy models (transformers). Graphs that are already quantized (QAT QDQ pairs, an
earlier INT8 pass) pass through untouched.

With calibration data (``calibration_dir``: a directory or ``module.py:function``) the pass can
also smooth activation outliers (``smooth_alpha``, see passes/quantize_prepare.py), verify the
padding mask so fused Attention becomes QAttention, and hold an accuracy budget (``min_cosine``,
``min_sample_cosine``): it searches (passes/quantization_search.py) the configured method, per-channel
weights and smoothing at each ``search_alphas``, measured on a held-out part of the calibration data
(``eval_samples`` files past ``samples``, else its last quarter); when none holds, the nodes of the
best one are kept float by measured sensitivity, up to ``max_exclusions``, or the pass fails with
the ranking and the best cosine. ``eval_dir`` names further held-out inputs that only gate the result.
"""

from __future__ import annotations

import dataclasses
import fnmatch

import numpy as np
import onnx_ir as ir
import onnx_ir.passes

from aotforge.core.errors import OptionsError, PassFailedError
from aotforge.passes import quantize_prepare as prep
from aotforge.passes.base import GraphPass
from aotforge.passes.calibration_feeds import load_samples
from aotforge.passes.integer_range import IntegerWeights, integer_weights
from aotforge.passes.ort_quantization import (
    QUANTIZED_OPS,
    adopt,
    op_counts,
    quantize_dynamic_int8,
    split_held_out,
)
from aotforge.passes.quantization_debug import Feeds, copy_model, sample_cosines
from aotforge.passes.quantization_search import SEARCH_MIN_RATIO, Budget, Method, search, summary

#: What ORT's dynamic quantizer can turn into integer ops.
_QUANTIZABLE = frozenset({"MatMul", "Gemm", "Conv", "Attention", "LSTM", "Gather", "EmbedLayerNormalization"})


@dataclasses.dataclass(frozen=True)
class QuantizeDynamicParams:
    #: One scale per output channel of each weight: much closer to fp32 on transformers.
    per_channel: bool = True
    #: The weights' integer type: int8, int8-7bit (ONNX Runtime's reduce_range), uint8, or ``auto``: int8 where this
    #: CPU's integer GEMM is exact, uint8 where it saturates (x86-64 without VNNI; ``integer_range``).
    weights: IntegerWeights = IntegerWeights.AUTO
    #: Op types to quantize; empty means ONNX Runtime's default set. ``Attention`` (fuse-ort's) becomes
    #: QAttention where its mask is proved (else it stays float); graphs without it are unaffected.
    op_types: tuple[str, ...] = ("MatMul", "Gemm", "Attention")
    #: Node names or fnmatch patterns (``node_MatMul_9*``) to keep float; each must match a node.
    nodes_to_exclude: tuple[str, ...] = ()
    #: Weight shapes to keep float, e.g. ``1536x384``: stable across exports, unlike node names.
    exclude_weight_shapes: tuple[str, ...] = ()
    #: Make com.microsoft Attention quantizable to QAttention (fold its weight, mask_index).
    qattention: bool = True
    #: Undo the SkipLayerNormalization fusion (ORT's CPU kernel for it is slow; see quantize_prepare): exact,
    #: and with QAttention what makes a fuse-ort export's int8 artifact fast (figures: docs/benchmarks.md).
    split_skip_layer_norm: bool = True
    #: SmoothQuant migration strength in (0, 1); 0 turns smoothing off. Needs calibration_dir.
    smooth_alpha: float = 0.0
    #: Smooth only nodes whose peak input channel exceeds this many times the median channel's peak.
    smooth_min_ratio: float = 0.0
    #: Calibration inputs (directory of .npz/.npy or ``module.py:function``) and how many to read.
    calibration_dir: str = ""
    samples: int = 32
    #: Held-out inputs the budget is measured on: files of calibration_dir past ``samples``.
    eval_samples: int = 64
    #: Further held-out inputs (read ``eval_samples`` of them) that only gate the result.
    eval_dir: str = ""
    #: Budget: least mean / least per-sample output cosine vs fp32 on held-out inputs; 0 turns either off.
    min_cosine: float = 0.0
    min_sample_cosine: float = 0.0
    #: Under a budget, try per-channel weights and smoothing before exclusions.
    search: bool = True
    #: SmoothQuant strengths the search tries (with calibration data).
    #: Strongest first: smoothing scales only outlier channels down (quantize_prepare.smooth); on a user MiniLM
    #: export 0.8 beat 0.5 on held-out sentences and on random token ids alike.
    search_alphas: tuple[float, ...] = (0.8, 0.5)
    max_exclusions: int = 8

    def __post_init__(self) -> None:
        if not 0 <= self.smooth_alpha < 1:
            raise OptionsError(f"pass int8-dynamic: smooth_alpha is in [0, 1), got {self.smooth_alpha}")
        if self.smooth_alpha and not self.calibration_dir:
            raise OptionsError("pass int8-dynamic: smooth_alpha needs calibration_dir (activation ranges)")
        if (self.min_cosine or self.min_sample_cosine) and not self.calibration_dir:
            raise OptionsError("pass int8-dynamic: min_cosine / min_sample_cosine need calibration_dir to measure on")
        for shape in self.exclude_weight_shapes:
            _parse_shape(shape)
        integer_weights(self.weights, "pass int8-dynamic")


class QuantizeDynamicPass(GraphPass):
    name = "int8-dynamic"
    Params = QuantizeDynamicParams
    changes_numerics = True

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        p = self.params
        wanted = set(p.op_types) or _QUANTIZABLE
        candidates = [n for n in model.graph if n.op_type in wanted]
        if op_counts(model) or not candidates:
            reason = "already quantized" if op_counts(model) else "no node to quantize"
            self.stats = {"nodes_quantized": 0, "skipped": reason}
            return onnx_ir.passes.PassResult(model, modified=False)
        excluded = resolve_exclusions(candidates, p.nodes_to_exclude, p.exclude_weight_shapes)
        if len(excluded) == len(candidates):
            split = prep.split_skip_layer_norm(model) if p.split_skip_layer_norm else 0
            self.stats = {"nodes_quantized": 0, "skipped": "every candidate excluded", "excluded": excluded}
            self.stats.update({"skip_layer_norm_split": split} if p.split_skip_layer_norm else {})
            return onnx_ir.passes.PassResult(model, modified=split > 0)
        budget = Budget(p.min_cosine, p.min_sample_cosine) if p.min_cosine or p.min_sample_cosine else None
        loaded = _load(model, p.calibration_dir, p.samples + (p.eval_samples if budget else 0))
        calibration, held_out = split_held_out(loaded, p.samples, p.eval_samples) if budget else (loaded, [])
        gate = _load(model, p.eval_dir, p.eval_samples)
        fp32 = copy_model(model) if budget or gate else None
        weights, why = integer_weights(p.weights, "pass int8-dynamic")
        self.stats = {"candidates": len(candidates), "calibration_samples": len(calibration)}
        self.stats["weights"] = {"type": weights.value, "why": why}
        self._prepare(model, wanted, calibration, excluded)
        configured = Method("dynamic", p.per_channel, smooth_alpha=p.smooth_alpha, smooth_min_ratio=p.smooth_min_ratio)
        record: dict = {}
        if budget is not None and fp32 is not None:
            prepared = copy_model(model)
            methods = self._methods(prepared, configured, bool(calibration))
            quantized, record = search(
                "int8-dynamic",
                fp32,
                methods,
                lambda method, exclude: self._quantized(prepared, calibration, method, [*excluded, *exclude]),
                (calibration, held_out),
                budget,
                p.max_exclusions,
            )
            excluded.extend(record["exclusions"])
            self.stats["accuracy_budget"] = record
        else:
            quantized = self._quantized(model, calibration, configured, excluded)
        adopt(model, quantized)
        chosen = record.get("chosen", configured.record())
        self.stats["method"] = chosen
        smoothed = prep.smoothed_nodes(model)
        if smoothed:
            self.stats["smoothed"] = {"alpha": chosen["smooth_alpha"], "nodes": len(smoothed), "names": smoothed}
        if gate and fp32 is not None:
            self.stats["eval"] = self._gate(fp32, model, gate)
        ops = op_counts(model, QUANTIZED_OPS - {"DynamicQuantizeLinear"})
        self.stats.update(nodes_quantized=sum(ops.values()), ops=ops, excluded=excluded)
        return onnx_ir.passes.PassResult(model, modified=True)

    def _prepare(
        self, model: ir.Model, wanted: set[str] | frozenset[str], calibration: list[Feeds], excluded: list[str]
    ) -> None:
        """QAttention-ready Attention nodes and the SkipLayerNormalization split, as the options ask."""
        p = self.params
        if p.qattention and "Attention" in wanted:
            self.stats["attention"] = {
                "weights_folded": prep.fold_attention_weights(model),
                "qkv_sizes_dropped": prep.drop_equal_qkv_sizes(model),
                "mask_index": len(prep.bias_to_mask_index(model, calibration[:4])),
            }
        # ORT's quantizer would drop an attention_bias (QAttention has no such input): those stay float.
        biased = [str(n.name) for n in model.graph if n.op_type == "Attention" and _has_attention_bias(n)]
        if biased and "Attention" in wanted:
            self.stats["float_attention_bias"] = biased
            excluded.extend(b for b in biased if b not in excluded)
        if p.split_skip_layer_norm:
            self.stats["skip_layer_norm_split"] = prep.split_skip_layer_norm(model)

    def _methods(self, prepared: ir.Model, configured: Method, calibrated: bool) -> list[Method]:
        """What the search tries, in order: as configured, per-channel, then smoothed at each alpha."""
        p = self.params
        if not p.search:
            return [configured]
        per_channel = dataclasses.replace(configured, per_channel=True)
        methods = [configured, per_channel]
        if calibrated and prep.smoothable(prepared):
            methods += [
                dataclasses.replace(per_channel, smooth_alpha=a, smooth_min_ratio=SEARCH_MIN_RATIO)
                for a in p.search_alphas
            ]
        return list(dict.fromkeys(methods))

    def _quantized(self, prepared: ir.Model, calibration: list[Feeds], method: Method, exclude: list[str]) -> ir.Model:
        """A copy of ``prepared``, smoothed as ``method`` says, dynamically quantized except ``exclude``."""
        p = self.params
        model = copy_model(prepared)
        if method.smooth_alpha:
            prep.smooth(model, calibration, method.smooth_alpha, method.smooth_min_ratio, exclude)
        weights, _ = integer_weights(p.weights, "pass int8-dynamic")
        quantize_dynamic_int8(model, method.per_channel, p.op_types, exclude, weights)
        return model

    def _gate(self, fp32: ir.Model, model: ir.Model, held_out: list[Feeds]) -> dict:
        cos = sample_cosines(fp32, model, held_out)
        record = {**summary(cos), "samples": len(held_out), "source": self.params.eval_dir}
        if float(np.mean(cos)) < self.params.min_cosine or min(cos) < self.params.min_sample_cosine:
            raise PassFailedError(
                f"pass int8-dynamic: held-out cosine vs fp32 {summary(cos)} on {self.params.eval_dir} is below the "
                f"budget (mean {self.params.min_cosine}, min {self.params.min_sample_cosine}); the calibration "
                "inputs do not represent these: calibrate on data like them, or exclude more nodes"
            )
        return record


def resolve_exclusions(candidates: list[ir.Node], patterns: tuple[str, ...], shapes: tuple[str, ...]) -> list[str]:
    """Names of the candidate nodes matched by a name pattern or a weight shape; each one must match."""
    names = [str(n.name) for n in candidates]
    out: list[str] = []
    for pattern in patterns:
        hit = fnmatch.filter(names, pattern)
        if not hit:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise OptionsError(
                f"pass int8-dynamic: nodes_to_exclude {pattern!r} matches no quantizable node (they are {shown}); "
                "names change with the exporter: use a pattern or exclude_weight_shapes"
            )
        out.extend(hit)
    for text in shapes:
        shape = _parse_shape(text)
        hit = [str(n.name) for n in candidates if _weight_shape(n) == shape]
        if not hit:
            raise OptionsError(
                f"pass int8-dynamic: exclude_weight_shapes {text!r} matches no quantizable node's weight"
            )
        out.extend(hit)
    return list(dict.fromkeys(out))


def _has_attention_bias(node: ir.Node) -> bool:
    return len(node.inputs) > 5 and node.inputs[5] is not None


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise OptionsError(f"pass int8-dynamic: weight shape {text!r} is not like 1536x384") from None


def _weight_shape(node: ir.Node) -> tuple[int, ...] | None:
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if weight is None:
        return None
    concat = weight.producer()  # fused Attention's packed QKV weight may still be a Concat
    if weight.const_value is None and concat is not None and concat.op_type == "Concat":
        return None
    return tuple(weight.shape.numpy()) if weight.shape is not None and weight.shape.is_static() else None


def _load(model: ir.Model, source: str, limit: int) -> list[Feeds]:
    return load_samples(model, source, limit) if source else []
