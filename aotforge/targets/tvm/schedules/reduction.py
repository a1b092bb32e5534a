"""CPU schedule for row reductions (layer_norm, softmax, RMS norm, mean) with vector accumulators.

DLight's ``cpu.Reduction`` keeps each row reduction a scalar loop: TVM's ``rfactor`` needs the
reduction to be the only child of its loop, which no longer holds once the blocks share the
row loop. Here every reduction over a lane-divisible inner axis is ``rfactor``-ed *first*,
while it still sits alone in its loop nest: its inner 16 elements become a vector of partial
results, reduced to a scalar afterwards. Then, as in DLight, the rows are fused and run in
parallel, every block is moved under the row loop and the element-wise blocks are vectorized.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from aotforge.targets.tvm.schedules.injective import PARALLEL_MIN
from aotforge.targets.tvm.schedules.rule import CpuRule

VECTOR = 16
#: Rows up to this long with no lane-divisible width are vectorized whole (else scalar loops of
#: libm-free fast exp: ViT's softmax over 37 tokens ran at ~3.5 ns an element).
ODD_ROW_MAX = 64


def _leading_spatial(kinds: str) -> int:
    return len(kinds) - len(kinds.lstrip("S"))


class RowReduction(CpuRule):
    """Parallel rows, rfactor-ed vector reductions, vectorized element-wise blocks."""

    @staticmethod
    def _apply(func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = dl.normalize_prim_func(sch)
        if infos is None or len(infos) < 2 or not infos[-1].is_injective():
            return None
        if all(b.is_injective() for b in infos):
            return None
        kinds = [b.dom_kind() for b in infos]
        rows = min(_leading_spatial(k) for k in kinds)
        if rows == 0 or any(not isinstance(d, int | tirx.IntImm) for b in infos for d in b.dom()):
            return None
        # 1. rfactor while each reduction is still alone in its loop nest.
        vector_blocks = []
        for info in infos:
            if info.is_injective():
                continue
            if kinds[infos.index(info)].count("R") != 1 or int(info.dom()[-1]) % VECTOR:
                continue  # several reduction axes or a short row: stays a scalar reduction
            loop = sch.get_loops(info.block_rv)[-1]
            _, lane = sch.split(loop, [None, VECTOR])
            vector_blocks.append(sch.rfactor(lane, factor_axis=len(info.dom()) - 1))
        # 2. rows in parallel, every block under the row loop.
        last = infos[-1].block_rv
        loops = sch.get_loops(last)
        row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
        n_rows = 1
        for d in infos[-1].dom()[:rows]:
            n_rows *= int(d)
        total = n_rows * int(_prod(infos[-1].dom()[rows:]))
        if total >= PARALLEL_MIN and n_rows > 1:
            sch.parallel(row)
        for block in reversed(_blocks_before(sch, last)):
            sch.compute_at(block, row, preserve_unit_loops=True)
        # 3. vectorize: element-wise blocks on their inner axis, rfactor blocks on the lanes.
        for block in _blocks_before(sch, last) + [last]:
            stmt = sch.get(block)
            if any(v.iter_type != tirx.IterVar.DataPar for v in stmt.iter_vars):
                continue
            _vectorize_inner(sch, block)
        for rf in vector_blocks:
            # rfactor loops: [row, ..., lane, outer]; put the lane innermost so it vectorizes.
            inner = sch.get_loops(rf)
            sch.reorder(inner[-1], inner[-2])
            sch.vectorize(sch.get_loops(rf)[-1])
            init = sch.decompose_reduction(rf, sch.get_loops(rf)[-2])
            sch.vectorize(sch.get_loops(init)[-1])
        return sch


def _prod(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _blocks_before(sch: s_tir.Schedule, last: s_tir.schedule.SBlockRV) -> list[s_tir.schedule.SBlockRV]:
    """Every block but ``last``, in program order (after rfactor added some)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    return [b for b in blocks if not sch.get(b).same_as(sch.get(last))]


def _vectorize_inner(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    loops = sch.get_loops(block)
    if len(loops) <= 1:
        return
    extent = sch.get(loops[-1]).extent
    if not isinstance(extent, tirx.IntImm) or int(extent) < 2:
        return
    n = int(extent)
    vec = next((v for v in (VECTOR, 8, 4, 2) if n % v == 0), 1)
    if vec == 1 and n <= ODD_ROW_MAX:
        vec = n  # a short odd row (ViT's 37 tokens) as one vector: LLVM splits it into full and masked ones
    if vec == n:
        sch.vectorize(loops[-1])
    elif vec > 1:
        sch.vectorize(sch.split(loops[-1], [None, vec])[1])


#: Four vector accumulators: one chain of dependent vmaxps/vaddps waits on its latency.
LANES = 4 * VECTOR


class FullReduction(CpuRule):
    """A reduction of a whole tensor to a scalar (``max(x)`` / ``min(x)`` of dynamic quantization).

    DLight's rules want a spatial axis to parallelize; with none, the reduction stayed one scalar
    loop over every element (MiniLM int8: 48 of them, a large share of the run). The innermost axis (all
    axes fused, when it does not divide) is ``rfactor``-ed into 4 x 16 lanes of partial results,
    reduced to the scalar at the end; one core streams it.
    """

    @staticmethod
    def _apply(func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = dl.normalize_prim_func(sch)
        if infos is None or len(infos) != 1 or "R" not in infos[0].dom_kind():
            return None
        dom = infos[0].dom()
        if any(not isinstance(d, int | tirx.IntImm) for d in dom):
            return None
        lanes = next((n for n in (LANES, VECTOR) if _prod(dom) % n == 0), 0)
        if not lanes:
            return None
        if any(int(d) != 1 for d, kind in zip(dom, infos[0].dom_kind(), strict=True) if kind != "R"):
            return None  # a spatial axis: RowReduction's case
        block = infos[0].block_rv
        loops = sch.get_loops(block)
        if int(dom[-1]) % lanes:  # fuse into one flat axis only when the last one is not lane-divisible
            loops = [sch.fuse(*loops)]
        # Splitting the innermost axis keeps its loads contiguous (a fused index divides per lane).
        _, lane = sch.split(loops[-1], [None, lanes])
        rf = sch.rfactor(lane, factor_axis=0)
        rf_loops = sch.get_loops(rf)  # rfactor leaves the lanes innermost
        sch.vectorize(rf_loops[-1])
        init = sch.decompose_reduction(rf, rf_loops[0])
        sch.vectorize(sch.get_loops(init)[-1])
        return sch
