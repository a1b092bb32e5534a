"""The Relax pipeline the ``tvm`` target compiles with, in one place.

To see what runs for a CPU build, read :func:`build` and the phase lists it is made of (each
step's why is in ``steps.py``). ``compile_relax`` returns the executable and a report of what the
pipeline did (recorded in the manifest as ``pipeline``, the steps' reports under ``schedules``).

Before them, on the ONNX graph: the import steps (``importable.import_steps``: onnx-ir passes, the
model serialized once for TVM's importer); a text-generation build's graphs take their weights as
inputs (``decoder/graphs.py``) and run the bind step of those.

Phases (all inside ``with target:``):

0. decoder (text-generation builds only, once, on the module of every bucket's prefill / decode /
   verify function): KV-cache scatters -> in-place writes (``kv_cache``, a build where one is
   left a copy is refused), decode attention over the filled cache only (``decode_attention``),
   RMSNorm squares into the mean's kernel (``norm_squares_fused``), the matmul weights packed
   (``weight_packing``: panels, or ``weight-only``'s format), what they left unused removed, and
   each function's weight arguments read (``weight_arguments``);
1. rewrites: bf16 graphs' NaN / Inf tests, matmul sums and transcendentals on fp32
   (``rewrites/bf16``); fast math (optional); projections of one input merged into one matmul
   (Q/K/V, ``rewrites/combine_matmuls``); integer matmuls (``int8-dynamic``) and QDQ
   convolutions (``int8``) with constant int8 weights -> AVX-512 VNNI kernels (depthwise ones ->
   an integer depthwise kernel; NHWC kept between them; each one's bias / clip / requantize
   in its write-back) where the target has VNNI (``rewrites/int8``: the ``int8_vnni`` report
   says which and why not), after Clip became maximum / minimum (``rewrites/clip``); NHWC
   convolutions;
2. legalize: the CPU backend's library dispatch + legalization + fusion passes (``cpu_generic``);
3. schedules: tuned schedules (optional: MetaSchedule records from the shared tuning store,
   searched first for workloads it lacks, ``tuning/``), then default schedules without search
   (``schedules/``) for the rest; what no rule matched is reported; constant matmul weights the
   matmul rule reads as contiguous j-tile panels are packed at compile time (``prepack_weights``);
4. lower: the CPU backend's dataflow lowering + finalization passes, then ``tvm.compile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aotforge.targets.tvm import steps
from aotforge.targets.tvm.relax_util import any_call, op_name
from aotforge.targets.tvm.steps import Step

if TYPE_CHECKING:
    from aotforge.targets.tvm.decoder.weight_only import WeightPacking
    from aotforge.targets.tvm.tuning.tune import TuneSettings

#: Step reports filed next to the default schedules' report, in this order.
_EXTRA_REPORTS = ("prepack_weights", "combine_matmuls", "int8_vnni", "bf16", "clip", "ieee_nan", "tuning")


def decoder_phase(
    *, kv_updates: int, packing: WeightPacking, paged: Sequence[str] = (), layers: int = 0, max_seq: int = 0
) -> list[Step]:
    return [
        steps.kv_cache_in_place(kv_updates),  # first: the attention step finds K / V as views of the in-place cache
        steps.DECODE_ATTENTION,
        steps.NORM_SQUARES,
        # on the attention kernel's calls, before packing: the paged copies then share the packed weights
        steps.paged_kv(paged, layers, max_seq),
        # after the graph rewrites, on the matmuls they leave; before every CPU phase, which reads the packed layout
        steps.pack_weights(packing),
        steps.DEAD_CODE,  # the transposes the panels made unused
        steps.WEIGHT_ARGUMENTS,  # last: the signatures the runtime calls, once packing changed them
    ]


def rewrite_phase(*, fast_math: bool, conv_nhwc: bool) -> list[Step]:
    return [
        steps.BF16,  # first: fast math is fp32-only, and a FoldConstant of a bf16 isnan would compile it
        *([steps.FAST_MATH] if fast_math else []),
        steps.COMBINE_MATMULS,  # before legalize: fusion then gives the merged matmul its bias epilogue
        # before NHWC and int8: a Clip the importers leave opaque pins its input to NCHW, and as
        # maximum / minimum it joins a quantized convolution's requantizing write-back
        steps.CLIP,
        steps.INT8_VNNI,  # before NHWC: QDQ convolutions become VNNI kernels that are channels-last themselves
        *([steps.NHWC] if conv_nhwc else []),
        # Last: after Clip became max / min, and on NHWC's ops (ConvertLayout does not know isnan / where).
        *([] if fast_math else [steps.IEEE_NAN]),
    ]


def legalize_phase() -> list[Step]:
    return [steps.LEGALIZE]


def schedule_phase(tuning: TuneSettings | None) -> list[Step]:
    return [*([steps.tuned(tuning)] if tuning is not None else []), steps.DEFAULT_SCHEDULES, steps.PREPACK_WEIGHTS]


def lower_passes(target: Any) -> list[Any]:
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    return list(cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))


def build(mod: Any, target: Any, *, fast_math: bool, conv_nhwc: bool, tuning: TuneSettings | None) -> tuple[Any, Any]:
    """``mod`` through the phases and compiled; the schedules report."""
    import tvm

    with target:
        phases = rewrite_phase(fast_math=fast_math, conv_nhwc=conv_nhwc) + legalize_phase() + schedule_phase(tuning)
        mod, reports = steps.run_steps(mod, target, phases)
        lower = tvm.transform.Sequential(lower_passes(target))
    schedules = {**reports["default_schedules"], **{k: reports[k] for k in _EXTRA_REPORTS if k in reports}}
    return tvm.compile(mod, target=target, relax_pipeline=lower), schedules


def compile_relax(
    mod: Any,
    target: Any,
    *,
    fast_math: bool,
    conv_nhwc: bool = True,
    tuning: TuneSettings | None = None,
    decoder: Sequence[Step] = (),
) -> tuple[Any, dict[str, Any]]:
    """Lower, schedule and build a Relax module for ``target``.

    ``decoder`` (:func:`decoder_phase`) runs first, once; its reports are under ``decoder``.
    NHWC is tried first for convolution models; Relax's ConvertLayout does not handle every
    graph (channel-shuffle reshapes, some concat / tuple patterns), so a failure there
    rebuilds in the source layout and the report says why.
    """
    stages = "cpu_generic+tuned+default_schedules" if tuning is not None else "cpu_generic+default_schedules"
    report: dict[str, Any] = {"pipeline": stages, "fast_math": fast_math}
    if decoder:
        with target:
            mod, report["decoder"] = steps.run_steps(mod, target, list(decoder))
    if conv_nhwc and _has_conv2d(mod):
        try:
            executable, schedules = build(mod, target, fast_math=fast_math, conv_nhwc=True, tuning=tuning)
            report.update(conv_layout="NHWC", schedules=schedules)
            return executable, report
        except Exception as e:  # TVM raises bare errors from its C++ passes
            from aotforge.core.errors import describe

            report["conv_layout_fallback"] = describe(e, last=True)
    executable, schedules = build(mod, target, fast_math=fast_math, conv_nhwc=False, tuning=tuning)
    report.update(conv_layout="source", schedules=schedules)
    return executable, report


def _has_conv2d(mod: Any) -> bool:
    return any_call(mod, lambda e: op_name(e) == "relax.nn.conv2d")
