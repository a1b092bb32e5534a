"""CPU schedule for injective PrimFuncs (elementwise, broadcast, reshape, transpose, pad).

Every block is inlined into its consumer where TVM allows; each remaining block gets its
innermost loop split by the widest vector width that divides it (no tail) and vectorized, and
its other loops fused and run in parallel.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target
from tvm_ffi import structural_equal

from aotforge.targets.tvm.schedules.rule import CpuRule

VECTOR = 16
#: Innermost loops up to this long that no vector width divides (37 tokens) are one vector.
ODD_ROW_MAX = 64
#: Below this many elements a parallel loop costs more than it saves (a fork/join per launch, and
#: a stall of a time slice when a worker is descheduled on a loaded machine).
PARALLEL_MIN = 32768


def schedule_spatial_block(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """Parallelize a spatial block's outer loops and vectorize its innermost one.

    Only the innermost loop is split for vectors, by the widest width that divides it: a vector
    that spans several output rows (a transpose onto 37 columns, NCHW -> NHWC onto 3 channels)
    indexes each lane with its own division and modulo, a gather far slower than the scalar loop
    (ViT's K^T). An innermost loop no width divides is one vector when it is short
    (``ODD_ROW_MAX``: LLVM splits it into full and masked ones) and every operand is read along
    it (rows copied or padded whole), else a scalar loop.
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
    if vec == 1 and VECTOR < last <= ODD_ROW_MAX and _rows_contiguous(sch.get(block)):
        sch.vectorize(loops[-1])
        outer_loops = loops[:-1]
    elif vec > 1:
        *rest, inner = sch.split(loops[-1], [None, vec])
        sch.vectorize(inner)
        outer_loops = [*loops[:-1], *rest]
    else:
        outer_loops = loops[:-1] if len(loops) > 1 else loops
    if not outer_loops:
        return
    outer = sch.fuse(*outer_loops) if len(outer_loops) > 1 else outer_loops[0]
    if total >= PARALLEL_MIN:
        sch.parallel(outer)


def _same_layout(block: tirx.SBlock) -> bool:
    """Whether every buffer the block reads has the shape of the one it writes and is indexed as it
    (elementwise), so that one fused index walks all of them contiguously.

    A copy between a padded and an unpadded buffer (a matmul's 37 rows padded to 40, its output's
    37 key columns padded to 48) indexes both alike, but their rows differ in length; fused, each
    lane would compute its own row and column (and, for a pad, its own bounds test) by division
    and modulo (ViT's attention-probability pad: most of its P @ V kernel).
    """
    if len(block.writes) != 1 or "if_then_else" in str(block.body):
        return False
    out = block.writes[0]
    written = [r.min for r in out.region]
    shape = [int(d) if isinstance(d, tirx.IntImm) else d for d in _buffer(out).shape]
    for read in block.reads:
        index = [r.min for r in read.region]
        if len(index) != len(written) or not structural_equal(index, written):
            return False
        read_shape = [int(d) if isinstance(d, tirx.IntImm) else d for d in _buffer(read).shape]
        if not structural_equal(read_shape, shape):
            return False
    return True


def _rows_contiguous(block: tirx.SBlock) -> bool:
    """Whether every buffer the block reads is indexed on its last axis as the output is (a copy or
    pad of whole rows: a short row is then one vector load; a transpose's would be a gather)."""
    if len(block.writes) != 1:
        return False
    last = block.writes[0].region[-1].min
    return all(r.region and structural_equal(r.region[-1].min, last) for r in block.reads)


def _buffer(region: Any) -> Any:
    """The buffer of a region (TVM 0.27: ``source``; older: ``buffer``)."""
    return getattr(region, "buffer", None) or region.source


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
