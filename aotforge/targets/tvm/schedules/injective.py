"""CPU schedule for injective PrimFuncs (elementwise, broadcast, reshape, transpose, pad).

Every block is inlined into its consumer where TVM allows; each remaining block gets its
innermost loop split by the widest vector width that divides it (no tail) and vectorized, and
its other loops fused and run in parallel.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target
from tvm_ffi import structural_equal

from aotforge.targets.tvm.schedules.rule import CpuRule

VECTOR = 16
#: Below this many elements a parallel loop costs more than it saves (a fork/join per launch, and
#: a stall of a time slice when a worker is descheduled on a loaded machine).
PARALLEL_MIN = 32768


def schedule_spatial_block(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """Parallelize a spatial block's outer loops and vectorize its innermost one.

    Only the innermost loop is split for vectors, by the widest width that divides it: a vector
    that spans several output rows (a transpose onto 37 columns, NCHW -> NHWC onto 3 channels)
    indexes each lane with its own division and modulo, a gather ~10x slower than the scalar loop
    (ViT's K^T: 12.6 -> ~1 us). An innermost loop no width divides stays a scalar loop.
    """
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [sch.get(loop).extent for loop in loops]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        sch.parallel(fused)
        return
    total = 1
    for e in extents:
        total *= int(e)
    if len(loops) > 1 and _same_layout(sch.get(block)):
        # Every operand indexed as the output: the fused index is one contiguous run.
        loops = [sch.fuse(*loops)]
    last = int(sch.get(loops[-1]).extent)
    vec = next((v for v in (VECTOR, 8, 4, 2) if last % v == 0), 1)
    if vec > 1:
        *rest, inner = sch.split(loops[-1], [None, vec])
        sch.vectorize(inner)
        outer_loops = [*loops[:-1], *rest]
    else:
        outer_loops = loops[:-1] if len(loops) > 1 else loops
    outer = sch.fuse(*outer_loops) if len(outer_loops) > 1 else outer_loops[0]
    if total >= PARALLEL_MIN:
        sch.parallel(outer)


def _same_layout(block: tirx.SBlock) -> bool:
    """Whether every buffer the block reads is indexed exactly as the one it writes (elementwise)."""
    if len(block.writes) != 1:
        return False
    written = [r.min for r in block.writes[0].region]
    for read in block.reads:
        index = [r.min for r in read.region]
        if len(index) != len(written) or not structural_equal(index, written):
            return False
    return True


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
