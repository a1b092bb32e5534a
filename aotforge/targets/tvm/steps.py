"""The named steps the ``tvm`` pipeline (``pipeline.py``) lists in its phases.

A :class:`Step` runs on a Relax module inside ``with target:`` and may return a report, which
the pipeline files in the manifest under the step's name. Each step says here why it sits where
the pipeline puts it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aotforge.targets.tvm.decoder.weight_only import WeightPacking
    from aotforge.targets.tvm.tuning.tune import TuneSettings

Report = dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class Step:
    #: the key its report goes under (``pipeline.schedules.<name>``)
    name: str
    run: Callable[[Any, Any], tuple[Any, Report]]


def run_steps(mod: Any, target: Any, steps: list[Step]) -> tuple[Any, dict[str, Any]]:
    """``mod`` through ``steps`` in order; the reports of those that returned one, by name."""
    reports: dict[str, Any] = {}
    for step in steps:
        mod, report = step.run(mod, target)
        if report is not None:
            reports[step.name] = report
    return mod, reports


def _bf16(mod: Any, _target: Any) -> tuple[Any, Report]:
    """What TIR lacks for bf16: isnan, in-place sums, fast erf / exp (``rewrites/bf16.py``)."""
    from aotforge.targets.tvm.rewrites.bf16 import rewrite_bf16

    return rewrite_bf16(mod)


def _fast_math(mod: Any, _target: Any) -> tuple[Any, Report]:
    """``exp`` / ``erf`` / ``tanh`` / softmax / GELU / sigmoid -> TVM's fast polynomial versions (~5e-6 max
    abs error), so vectorized loops do not call scalar libm (``FastMathTransform`` misses GELU and sigmoid)."""
    from tvm import relax

    from aotforge.targets.tvm.rewrites.fast_gelu import fast_gelu_pass

    mod = fast_gelu_pass()(mod)
    return relax.transform.FastMathTransform()(mod), None


def _combine_matmuls(mod: Any, _target: Any) -> tuple[Any, Report]:
    """Projections of one input with constant weights (Q/K/V) -> one matmul and a split
    (``rewrites/combine_matmuls.py``): one kernel with 3x the columns instead of three."""
    from aotforge.targets.tvm.rewrites.combine_matmuls import combine_matmuls

    return combine_matmuls(mod)


def _int8_vnni(mod: Any, target: Any) -> tuple[Any, Report]:
    """Integer matmuls and QDQ convolutions -> AVX-512 VNNI kernels (``rewrites/int8.py``)."""
    from aotforge.targets.tvm.rewrites.int8 import integer_ops_on_vnni

    return integer_ops_on_vnni(mod, target)


def _clip(mod: Any, _target: Any) -> tuple[Any, Report]:
    """Clip (ReLU6, hard-tanh) as Relax maximum / minimum (``rewrites/clip.py``): the importers'
    forms are opaque to ConvertLayout, which pinned each to NCHW between two transposes."""
    from aotforge.targets.tvm.rewrites.clip import clip_as_min_max

    return clip_as_min_max(mod)


def _ieee_nan(mod: Any, _target: Any) -> tuple[Any, Report]:
    """fast_math=false: NaN through max / min / relu / Clip as ORT gives it (``rewrites/ieee_nan.py``)."""
    from aotforge.targets.tvm.rewrites.ieee_nan import propagate_nan

    return propagate_nan(mod)


def _nhwc(mod: Any, _target: Any) -> tuple[Any, Report]:
    """NHWC activations + HWIO weights put output channels last: the tiled rule then vectorizes
    over them (16 lanes for widths 32-256) with contiguous weight loads, where NCHW would
    vectorize over output width (7-56, scalar at 7)."""
    from tvm import relax

    return relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(mod), None


def _legalize(mod: Any, target: Any) -> tuple[Any, Report]:
    """The CPU backend's library dispatch, legalization and fusion passes (``cpu_generic``)."""
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    return tvm.transform.Sequential(cpu.library_dispatch_passes(target) + cpu.legalize_passes(target))(mod), None


def _tuned(mod: Any, target: Any, settings: TuneSettings) -> tuple[Any, Report]:
    """MetaSchedule records from the shared store (searched first for what it lacks), where they beat the default."""
    from aotforge.targets.tvm.tuning.tune import apply_tuned, tune_module

    database, report = tune_module(mod, target, settings)
    mod, report["from_database"] = apply_tuned(mod, database)
    return mod, report


def _default_schedules(mod: Any, _target: Any) -> tuple[Any, Report]:
    """Search-free rules (GEMV, register-tiled matmul/conv, reductions, injective) for every PrimFunc left."""
    from tvm import relax

    from aotforge.targets.tvm.schedules import apply_default_schedules

    if _weights_are_constants(mod):
        # Which PrimFunc parameters are constants: the matmul rule reads those packed (_prepack_weights).
        mod = relax.transform.AttachAttrLayoutFreeBuffers()(mod)
    return apply_default_schedules(mod)


def _weights_are_constants(mod: Any) -> bool:
    """No Relax function takes weights as arguments (``num_input`` < its parameters, as generative
    builds do): a packed copy of an argument would be made every call, not folded at compile time."""
    from tvm import relax

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function) and func.attrs is not None and "num_input" in func.attrs:
            if int(func.attrs["num_input"]) < len(func.params):
                return False
    return True


def _prepack_weights(mod: Any, _target: Any) -> tuple[Any, Report]:
    """Constant weights a schedule reads in another layout (``schedules/weight_packing``) are
    re-laid out at compile time: the layout-rewrite copies split into functions of their own and
    folded over the constants, so no call pays for them."""
    from tvm import relax

    from aotforge.targets.tvm.schedules.weight_packing import has_packed_weights

    if not has_packed_weights(mod):
        # The pass refuses PrimFuncs without a root block or a compute block under it (hand-written
        # kernels such as kernels/decode_attention, some legalized Slices): run it only where the
        # matmul rule packed a weight (never in generative builds, whose weights are arguments).
        return mod, None
    try:
        split = relax.transform.SplitLayoutRewritePreproc()(mod)
    except Exception as e:  # tvm.error.TVMError, or an InternalError raised through the FFI
        # The copies stay inside their functions: the same numerics, paid per call.
        return mod, {"packed_weights": 0, "not_split": str(e).strip().splitlines()[-1][:200]}
    mod = split
    packing = [gv.name_hint for gv, _ in mod.functions_items() if gv.name_hint.endswith(_PREPACK)]
    if not packing:
        return mod, None
    mod = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(mod))
    left = sorted(gv.name_hint for gv, _ in mod.functions_items() if gv.name_hint.endswith(_PREPACK))
    return mod, {"packed_weights": len(packing) - len(left), "not_folded": left}


def _kv_cache_in_place(mod: Any, _target: Any, updates: int) -> tuple[Any, Report]:
    """The decode graphs' KV-cache scatters -> in-place writes into the cache argument
    (``rewrites/kv_inplace.py``); a build where one stays a copy is refused: it would copy the cache every token."""
    from aotforge.core.errors import CompileError
    from aotforge.targets.tvm.rewrites.kv_inplace import kv_cache_in_place

    mod, report = kv_cache_in_place(mod)
    if report["in_place"] != updates:
        raise CompileError(
            f"tvm: {report['in_place']} of the decode graphs' {updates} KV-cache updates "
            f"could be made in place ({report['skipped']}): the cache would be copied every token"
        )
    return mod, report


def _decode_attention(mod: Any, _target: Any) -> tuple[Any, Report]:
    """Decode / verify attention over the in-place cache -> a kernel reading only its filled rows
    (``rewrites/decode_attention.py``): after the KV step, which makes K / V views of that cache."""
    from aotforge.targets.tvm.rewrites.decode_attention import attention_over_filled_cache

    return attention_over_filled_cache(mod)


def _norm_squares(mod: Any, _target: Any) -> tuple[Any, Report]:
    """An RMSNorm's square joins its mean's kernel (``rewrites/mean_of_square.py``)."""
    from aotforge.targets.tvm.rewrites.mean_of_square import norm_squares_fused

    mod, count = norm_squares_fused(mod)
    return mod, {"fused": count}


def _paged_kv(mod: Any, _target: Any, names: tuple[str, ...], layers: int, max_seq: int) -> tuple[Any, Report]:
    """Paged copies of the decode / verify functions ``names`` (``rewrites/paged_kv.py``), when every layer's
    attention in them is on the decode-attention kernel; otherwise the artifact serves from its slot functions."""
    from tvm import relax

    from aotforge.targets.tvm.rewrites.paged_kv import paged_functions, tir_callee

    if not names:
        return mod, {}
    on_kernel = 0

    def count(expr: Any) -> None:
        nonlocal on_kernel
        on_kernel += tir_callee(expr, "relax.call_tir").startswith("decode_attention_")

    for name in names:
        relax.analysis.post_order_visit(mod[name], count)
    if on_kernel != layers * len(names):
        why = f"{on_kernel} of {layers * len(names)} attentions on the kernel: this artifact serves from slots"
        return mod, {"functions": [], "skipped": why}
    mod, counts = paged_functions(mod, names, max_seq)
    return mod, {"functions": list(names), **counts}


def _dead_code(mod: Any, _target: Any) -> tuple[Any, Report]:
    """What earlier steps left unused (the transposes the weight panels replaced)."""
    from tvm import relax

    return relax.transform.DeadCodeElimination()(mod), None


def _weight_arguments(mod: Any, _target: Any) -> tuple[Any, Report]:
    """Which weight arguments each function takes, in order (after its ``num_input`` runtime inputs): what the
    runtime hands it, read once the steps that change signatures (packing) have run."""
    from tvm import relax

    return mod, {
        gv.name_hint: [str(p.name) for p in func.params[int(func.attrs["num_input"]) :]]
        for gv, func in mod.functions_items()
        if isinstance(func, relax.Function) and func.attrs is not None and "num_input" in func.attrs
    }


#: The suffix ``SplitLayoutRewritePreproc`` gives the functions that pack a weight.
_PREPACK = "_weight_prepack"


BF16 = Step("bf16", _bf16)
FAST_MATH = Step("fast_math", _fast_math)
COMBINE_MATMULS = Step("combine_matmuls", _combine_matmuls)
INT8_VNNI = Step("int8_vnni", _int8_vnni)
CLIP = Step("clip", _clip)
IEEE_NAN = Step("ieee_nan", _ieee_nan)
NHWC = Step("conv_nhwc", _nhwc)
LEGALIZE = Step("legalize", _legalize)
DEFAULT_SCHEDULES = Step("default_schedules", _default_schedules)
PREPACK_WEIGHTS = Step("prepack_weights", _prepack_weights)


DECODE_ATTENTION = Step("decode_attention", _decode_attention)
NORM_SQUARES = Step("norm_squares_fused", _norm_squares)
DEAD_CODE = Step("dead_code", _dead_code)
WEIGHT_ARGUMENTS = Step("weight_arguments", _weight_arguments)


def tuned(settings: TuneSettings) -> Step:
    return Step("tuning", functools.partial(_tuned, settings=settings))


def kv_cache_in_place(updates: int) -> Step:
    """The KV step, refusing the build unless all ``updates`` cache scatters became in-place writes."""
    return Step("kv_cache", functools.partial(_kv_cache_in_place, updates=updates))


def paged_kv(names: Sequence[str], layers: int, max_seq: int) -> Step:
    """Paged copies (a KV pool read through a block table) of the decode / verify functions ``names``."""
    return Step("paged_kv", functools.partial(_paged_kv, names=tuple(names), layers=layers, max_seq=max_seq))


def pack_weights(packing: WeightPacking) -> Step:
    """A text-generation build's matmul weights packed (``decoder/weight_only.py``); ``packing`` keeps the arrays."""
    return Step("weight_packing", packing.run)
