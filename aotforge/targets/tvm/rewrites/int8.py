"""Relax pass: integer matmuls and QDQ convolutions with constant int8 weights -> VNNI (tvm target).

Kernel rules: ``int8_matmul`` (``int8-dynamic``'s integer matmuls -> the VNNI dense kernel) and
``int8_conv`` (static ``int8``'s QDQ convolutions -> the VNNI convolution kernel, depthwise ones
-> the int8 depthwise kernel). Everything they look at and leave alone is counted, with the
reason, in the report (``int8_vnni``); on a target without AVX-512 VNNI nothing is rewritten and
the report says so. ``channels_last`` rules then keep the convolutions' NHWC outputs NHWC
through the elementwise ops between them (``channels_last_ops`` counts those ops).
"""

from __future__ import annotations

from typing import Any

from aotforge.targets.tvm.rewrites.channels_last import ElementwiseOnTwins, SpatialMeanOnTwin, Twins
from aotforge.targets.tvm.rewrites.int8_conv import QdqConvToVnni, QdqDepthwiseConv
from aotforge.targets.tvm.rewrites.int8_epilogue import KernelBuilders, RequantizeInKernel, readers
from aotforge.targets.tvm.rewrites.int8_matmul import IntegerMatmulToVnni
from aotforge.targets.tvm.rewrites.rule import Rule, apply_rules, count_matches


def integer_rules(*, amx: bool = False, builders: KernelBuilders | None = None) -> list[Rule]:
    """The kernel rules, then the ones that keep their NHWC outputs NHWC (one ``Twins`` table shared);
    ``amx``: matmuls go to the AMX tile kernel where their shape allows; ``builders`` collects the
    convolution kernels ``int8_epilogue`` may rebuild."""
    twins, builders = Twins(), builders or KernelBuilders()
    return [
        IntegerMatmulToVnni(amx=amx),
        QdqConvToVnni(twins, builders),
        QdqDepthwiseConv(twins, builders),
        ElementwiseOnTwins(twins),
        SpatialMeanOnTwin(twins),
    ]


def count_integer_ops(mod: Any) -> int:
    """How many int32-accumulating matmuls and QDQ convolutions ``mod``'s Relax functions hold."""
    return count_matches(mod, integer_rules())


def rewrite_integer_ops(mod: Any, *, amx: bool = False) -> tuple[Any, dict[str, Any] | None]:
    """Rewrite every matching integer matmul and QDQ convolution of ``mod``; what happened, or
    ``None`` (nothing to report) for a graph with neither."""
    from tvm import relax

    builders = KernelBuilders()
    rewritten, stats = apply_rules(mod, integer_rules(amx=amx, builders=builders))
    # The int32 widening of each rewritten weight is dead afterwards, and so is each NCHW transpose
    # of a channels-last value nothing reads in NCHW; drop them before counting readers.
    mod = relax.transform.DeadCodeElimination()(rewritten)
    # A second walk, on the channels-last chains the first one made: each convolution's requantize
    # into its kernel's write-back; the int32 kernels and float chains it replaced are dead after it.
    mod, epilogues = apply_rules(mod, [RequantizeInKernel(builders, readers(mod))])
    mod = relax.transform.DeadCodeElimination()(mod)
    channels_last = stats.applied.pop(ElementwiseOnTwins.name, 0)
    if not stats.applied and not stats.skipped:
        return mod, None
    report = {"rewritten": sum(stats.applied.values()), "by_op": dict(stats.applied), "kernels": stats.kernels}
    report["amx_kernels"] = sum(gv.name_hint.startswith("amx_dense") for gv in mod.get_global_vars())
    report["requantize_epilogues"] = epilogues.applied[RequantizeInKernel.name]
    report["epilogues_left"] = dict(epilogues.skipped)
    return mod, {**report, "skipped": dict(stats.skipped), "channels_last_ops": channels_last}


def integer_ops_on_vnni(mod: Any, target: Any) -> tuple[Any, dict[str, Any] | None]:
    """The rewrite where ``target`` has VNNI; else the count of what it would have taken, as skipped."""
    from tvm.target.codegen import target_has_features

    if target_has_features("avx512vnni", target):
        return rewrite_integer_ops(mod, amx=target_has_features("amx-int8", target))
    found = count_integer_ops(mod)
    if not found:
        return mod, None
    return mod, {"rewritten": 0, "skipped": {f"target {target.attrs['mcpu']} has no avx512vnni": found}}
