"""CPU schedule for window reductions whose reduction axes sit inside all spatial ones (pooling).

``max_pool2d`` / ``avg_pool2d`` in NHWC reduce a small window per output element; DLight's
``cpu.Reduction`` expects row reductions and leaves them as scalar loops. Here the padding
producer is inlined (a vector select), the spatial loops outside the vector axis are fused and
run in parallel, the window loops come next and the innermost spatial axis (channels in NHWC)
is vectorized, so each window step is one vector max / add.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from aotforge.targets.tvm.schedules.injective import PARALLEL_MIN, schedule_spatial_block
from aotforge.targets.tvm.schedules.rule import CpuRule

VECTOR = 16
#: Largest window (product of the reduction extents) treated as pooling; 7x7 = 49.
MAX_WINDOW = 64


class WindowReduction(CpuRule):
    """One reduction block over a small 2-D+ window, spatial axes first, a vectorizable innermost one."""

    @staticmethod
    def _apply(func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = dl.normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [k for k, b in enumerate(infos) if not b.is_injective()]
        if len(reductions) != 1:
            return None
        at = reductions[0]
        kinds = infos[at].dom_kind()
        n_s = len(kinds) - len(kinds.lstrip("S"))
        if n_s < 2 or set(kinds[n_s:]) != {"R"}:
            return None
        extents = infos[at].dom()
        if any(not isinstance(d, int | tirx.IntImm) for d in extents):
            return None
        window = 1
        for d in extents[n_s:]:
            window *= int(d)
        if len(extents) - n_s < 2 or window > MAX_WINDOW:
            return None  # a row reduction (softmax, layer_norm, mean): not a pooling window
        inner = int(extents[n_s - 1])
        vec = next((v for v in (VECTOR, 8, 4) if inner % v == 0), 0)
        if vec == 0:
            return None  # the innermost spatial axis is not a channel axis: not pooling in NHWC
        red = infos[at].block_rv
        separate = []
        for info in infos[:at]:
            try:
                sch.compute_inline(info.block_rv)
            except Exception:
                separate.append(info.block_rv)
        for info in infos[at + 1 :][::-1]:
            try:
                sch.reverse_compute_inline(info.block_rv)
            except Exception:
                separate.append(info.block_rv)
        loops = sch.get_loops(red)
        s_loops, r_loops = loops[:n_s], loops[n_s:]
        vo, vi = sch.split(s_loops[-1], [None, vec])
        sch.reorder(*s_loops[:-1], vo, *r_loops, vi)
        outer = sch.fuse(*s_loops[:-1], vo)
        total = 1
        for d in extents[:n_s]:
            total *= int(d)
        if total >= PARALLEL_MIN:
            sch.parallel(outer)
        sch.vectorize(vi)
        init = sch.decompose_reduction(red, r_loops[0])
        sch.vectorize(sch.get_loops(init)[-1])
        for b in separate:
            schedule_spatial_block(sch, b)
        return sch
