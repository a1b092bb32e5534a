"""The Relax pipeline the ``tvm`` target compiles with, in one place.

To see what runs for a CPU build, read this function. ``compile_relax`` returns the
executable and a report of what the pipeline did (recorded in the manifest).

Stages (all inside ``with target:``):

0. bf16 graphs: NaN / Inf tests, matmul sums and transcendentals on fp32 (``targets.tvm.rewrites.bf16``);
1. fast math (optional): ``exp`` / ``erf`` / ``tanh`` / softmax / GELU -> TVM's fast
   polynomial versions (~5e-6 max abs error), so vectorized loops do not call scalar libm;
2. integer matmuls (``int8-dynamic``) and QDQ convolutions (``int8``) with constant int8 weights
   -> AVX-512 VNNI kernels (``targets.tvm.rewrites.int8``) where the target has VNNI; the report
   (``int8_vnni``) says which and why not;
3. the CPU backend's library dispatch + legalization + fusion passes (``cpu_generic``);
4. tuned schedules (optional): MetaSchedule records from the shared tuning store, searched
   first for workloads it lacks (``targets.tvm.tuning.tune``), applied where they beat the default;
5. default schedules without search (``targets.tvm.schedules``: GEMV, register-tiled
   matmul/conv, reductions, injective ops) for the rest; what no rule matched is reported;
6. the CPU backend's dataflow lowering + finalization passes, then ``tvm.compile``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aotforge.targets.tvm.relax_util import any_call, op_name

if TYPE_CHECKING:
    from aotforge.targets.tvm.tuning.tune import TuneSettings


def _has_conv2d(mod: Any) -> bool:
    return any_call(mod, lambda e: op_name(e) == "relax.nn.conv2d")


def _integer_ops(mod: Any, target: Any) -> tuple[Any, dict[str, Any] | None]:
    """The VNNI rewrite where it applies; ``None`` (nothing to report) for float-only graphs."""
    from tvm.target.codegen import target_has_features

    from aotforge.targets.tvm.rewrites.int8 import count_integer_ops, rewrite_integer_ops

    if target_has_features("avx512vnni", target):
        return rewrite_integer_ops(mod)
    found = count_integer_ops(mod)
    if not found:
        return mod, None
    return mod, {"rewritten": 0, "skipped": {f"target {target.attrs['mcpu']} has no avx512vnni": found}}


def compile_relax(
    mod: Any, target: Any, *, fast_math: bool, conv_nhwc: bool = True, tuning: TuneSettings | None = None
) -> tuple[Any, dict[str, Any]]:
    """Lower, schedule and build a Relax module for ``target``.

    NHWC is tried first for convolution models; Relax's ConvertLayout does not handle every
    graph (channel-shuffle reshapes, some concat / tuple patterns), so a failure there
    rebuilds in the source layout and the report says why.
    """
    stages = "cpu_generic+tuned+default_schedules" if tuning is not None else "cpu_generic+default_schedules"
    report: dict[str, Any] = {"pipeline": stages, "fast_math": fast_math}
    if conv_nhwc and _has_conv2d(mod):
        try:
            executable, schedules = _build(mod, target, fast_math=fast_math, conv_nhwc=True, tuning=tuning)
            report.update(conv_layout="NHWC", schedules=schedules)
            return executable, report
        except Exception as e:  # TVM raises bare errors from its C++ passes
            from aotforge.core.errors import describe

            report["conv_layout_fallback"] = describe(e, last=True)
    executable, schedules = _build(mod, target, fast_math=fast_math, conv_nhwc=False, tuning=tuning)
    report.update(conv_layout="source", schedules=schedules)
    return executable, report


def _build(mod: Any, target: Any, *, fast_math: bool, conv_nhwc: bool, tuning: TuneSettings | None) -> tuple[Any, Any]:
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from aotforge.targets.tvm.rewrites.bf16 import rewrite_bf16
    from aotforge.targets.tvm.rewrites.fast_gelu import fast_gelu_pass
    from aotforge.targets.tvm.schedules import apply_default_schedules

    with target:
        # First: fast math below is fp32-only, and a FoldConstant of a bf16 isnan would compile it.
        mod, bf16 = rewrite_bf16(mod)  # what TIR lacks for bf16: isnan, in-place sums, fast erf / exp
        if fast_math:
            mod = fast_gelu_pass()(mod)
            mod = relax.transform.FastMathTransform()(mod)
        # Before NHWC: QDQ convolutions become VNNI kernels that are channels-last themselves.
        mod, int8 = _integer_ops(mod, target)
        if conv_nhwc:
            # NHWC activations + HWIO weights put output channels last: the tiled rule then
            # vectorizes over them (16 lanes for widths 32-256) with contiguous weight loads,
            # where NCHW would vectorize over output width (7-56, scalar at 7).
            mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(mod)
        mod = tvm.transform.Sequential(cpu.library_dispatch_passes(target) + cpu.legalize_passes(target))(mod)
        tuned = None
        if tuning is not None:
            from aotforge.targets.tvm.tuning.tune import apply_tuned, tune_module

            database, tuned = tune_module(mod, target, tuning)
            mod, tuned["from_database"] = apply_tuned(mod, database)
        mod, schedules = apply_default_schedules(mod)
        if int8 is not None:
            schedules = {**schedules, "int8_vnni": int8}
        if bf16 is not None:
            schedules = {**schedules, "bf16": bf16}
        if tuned is not None:
            schedules = {**schedules, "tuning": tuned}
        lower = tvm.transform.Sequential(cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))
    return tvm.compile(mod, target=target, relax_pipeline=lower), schedules
