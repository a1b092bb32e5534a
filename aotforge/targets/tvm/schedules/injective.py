"""CPU schedule for injective PrimFuncs (elementwise, broadcast, reshape, transpose, pad).

Every block is inlined into its consumer where TVM allows; each remaining block gets its
loops fused, split by the widest vector width that divides the total extent (no tail), the
outer part run in parallel and the inner part vectorized.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from aotforge.targets.tvm.schedules.rule import CpuRule

VECTOR = 16
#: Below this many elements a parallel loop costs more than it saves (a fork/join per launch, and
#: a stall of a time slice when a worker is descheduled on a loaded machine).
PARALLEL_MIN = 32768


def schedule_spatial_block(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """Fuse a spatial block's loops, parallelize the outer part and vectorize the inner part."""
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = sch.get(fused).extent
    if not isinstance(extent, tirx.IntImm):
        sch.parallel(fused)
        return
    total = int(extent)
    vec = next((v for v in (VECTOR, 8, 4, 2) if total % v == 0), 1)
    if vec > 1:
        outer, inner = sch.split(fused, [None, vec])
        sch.vectorize(inner)
    else:
        outer = fused
    if total >= PARALLEL_MIN:
        sch.parallel(outer)


class Injective(CpuRule):
    """Fuse + parallel + vectorize for functions made only of spatial blocks."""

    @staticmethod
    def _apply(func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = dl.normalize_prim_func(sch)
        if not infos or not all(b.is_injective() for b in infos):
            return None
        remaining = []
        for info in infos[:-1]:
            try:
                sch.compute_inline(info.block_rv)
            except Exception:
                remaining.append(info.block_rv)
        remaining.append(infos[-1].block_rv)
        for block in remaining:
            schedule_spatial_block(sch, block)
        return sch
