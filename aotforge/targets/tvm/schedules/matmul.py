"""Register-tiled CPU schedule for matmul / dense / batch-matmul / direct convolution.

One rule covers every PrimFunc whose single reduction block is a sum of products
(``C[...] += A[...] * B[...]``) with the reduction iterators after the spatial ones:

- the last spatial axis ``j`` is the vector axis, tiled by up to 32 (2 x 16 lanes; 48 with AVX-512);
- ``i`` is the innermost spatial axis of the operand that does not depend on ``j`` (the
  "broadcast" operand: ``A`` of a matmul, the weights of a convolution), tiled by up to 8;
- outer spatial loops and the tile loops (j tiles outside i tiles) are fused and run in parallel
  (when the kernel is big enough to pay for a fork/join);
- the accumulator tile lives in a ``local`` buffer, its write-back carries the fused
  elementwise epilogue (bias, residual add, activation);
- tile sizes are divisors of the extents, so no tail predicate ever reaches a vector loop
  (an ``N`` with no divisor among the vector widths gets narrower vectors, down to scalars);
  an ``i`` extent with no divisor from 4 to 8 (a prime token count) is padded to 8-row tiles,
  and a ``j`` extent only narrow vectors divide (attention over 37 or 77 keys) to full vectors;
- a constant 2-D weight is read as contiguous j-tile panels, packed at compile time
  (``weight_packing.py``).

What qualifies and how its axes are found is ``matmul_match.py``.

Producers that would put ``if_then_else`` into the inner loop (padding) stay separate loop
nests and get an injective schedule. Anything else the rule cannot handle returns ``None``.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from aotforge.targets.tvm.schedules.injective import schedule_spatial_block
from aotforge.targets.tvm.schedules.matmul_match import Matmul, match
from aotforge.targets.tvm.schedules.rule import CpuRule
from aotforge.targets.tvm.schedules.weight_packing import mark_packed, pack_weight

TILE_I = 8
TILE_J = 32
# 32 vector registers (AVX-512) hold an 8 x 48 accumulator tile plus its operands; 16 do not.
TILE_J_AVX512 = 48
VECTOR = 16
K_BLOCK = 256
ACC_BLOCK_BYTES = 64 * 1024
MIN_PARALLEL_CHUNKS = 8
#: Below this many multiply-adds (microseconds on one core) a kernel runs on the calling thread: TVM
#: splits a parallel loop statically, so every launch is a fork/join that waits for the slowest thread
#: (ViT's 37-token kernels ran slower on 2 threads than on 1), and a descheduled worker stalls the join.
PARALLEL_MIN_MACS = 1 << 21


def _largest_divisor(n: int, limit: int, step: int = 1) -> int:
    """The largest multiple of ``step`` that divides ``n`` and is at most ``limit`` (0 if none)."""
    for d in range(limit - limit % step, 0, -step):
        if n % d == 0:
            return d
    return 0


def _vector_width(n: int) -> int:
    for v in (VECTOR, 8, 4, 2):
        if n % v == 0:
            return v
    return 1


def _split_k(sch: s_tir.Schedule, outer: list[Any], r_loops: list[Any], m: int, tj: int) -> bool:
    """Whether to block a single long reduction loop (the i-tile loop is ``outer[-1]``).

    Only when the k blocks divide evenly, the m x tj accumulator block stays small (it lives
    on the stack) and the loops left to parallelize still give every core several chunks.
    """
    if len(r_loops) != 1 or len(outer) < 2 or m * tj * 4 > ACC_BLOCK_BYTES:
        return False
    k = int(sch.get(r_loops[0]).extent)
    parallel = 1
    for loop in outer[:-1]:
        parallel *= int(sch.get(loop).extent)
    return k > K_BLOCK and k % K_BLOCK == 0 and parallel >= MIN_PARALLEL_CHUNKS


def _tile_j(target: Target) -> int:
    """The j tile for ``target`` (BERT-base's 768-wide dense layers: faster at 48 with AVX-512)."""
    from tvm.target.codegen import target_has_features

    try:
        return TILE_J_AVX512 if target_has_features("avx512f", target) else TILE_J
    except Exception:  # not an LLVM target TVM can query
        return TILE_J


def _has_if_then_else(block: tirx.SBlock) -> bool:
    # TVM 0.27's Python API has no TIR expression visitor; the printed body is enough here.
    return "if_then_else" in str(block.body)


def _i_tile(m: int) -> int:
    """The i tile: the largest divisor of ``m`` up to 8, or 8 with a ragged last tile when that is < 4.

    A prime ``m`` (ViT's 37 tokens: 36 patches + CLS) would otherwise get 1-row tiles, which
    load the weight panel once per row (ViT's matmuls several times slower); the ragged tile is padded
    (``_pad``).
    """
    ti = _largest_divisor(m, TILE_I)
    return TILE_I if ti < TILE_I // 2 and m > TILE_I else ti


def _pad_columns(n: int) -> int:
    """The vector-axis extent to pad ``n`` to (``n`` itself when no padding is worth it).

    An ``n`` only narrow vectors divide (attention scores over 37 or 77 keys: scalar code) is padded to a
    multiple of the full width, a few zero columns being cheaper than 4x-16x narrower vectors.
    """
    if n <= VECTOR or _vector_width(n) >= 8:
        return n
    return -(-n // VECTOR) * VECTOR


def _pad(sch: s_tir.Schedule, mm: Matmul, ti: int, pad_i: bool, pad_j: bool) -> bool:
    """Pad the i extent to a multiple of ``ti`` and / or the j extent to a multiple of the vector
    width (zero-filled copies of the operands that use them).

    A row test in the k loop instead would keep the accumulators out of registers. False when
    the block is not an einsum (a convolution's ``h * stride + kh``).
    """
    padding = [1] * len(sch.get(mm.block).iter_vars)
    if pad_i:
        padding[mm.i] = ti
    if pad_j:
        padding[mm.j] = VECTOR
    try:
        sch.pad_einsum(mm.block, padding)
    except Exception:  # a schedule error leaves the function as it was
        return False
    return True


def _inline_neighbours(sch: s_tir.Schedule, infos: list[Any], mm: Matmul, ti: int) -> tuple[Any, list[Any], int, int]:
    """The local accumulator's write-back block, the blocks left separate, the i tile and the j extent.

    Producers are inlined when harmless, else kept as their own (scheduled) loop nests. A ragged
    i tile pads the rows, or falls back to a divisor tile; a j extent without a wide vector width
    pads the columns (``_pad_columns``). The accumulator goes to a local tile
    whose write-back carries the elementwise epilogue: intermediate epilogue blocks are inlined
    into their consumers first (a value used twice, as in GELU's x * erf(x), is then recomputed),
    so only the last one reads the accumulator and can be merged into the write-back.
    """
    at, red = mm.at, mm.block
    separate = []
    for info in infos[:at]:
        b = info.block_rv
        if _has_if_then_else(sch.get(b)):
            separate.append(b)
            continue
        try:
            sch.compute_inline(b)
        except Exception:
            separate.append(b)
    epilogue = [info.block_rv for info in infos[at + 1 :]]
    pad_i = mm.i >= 0 and mm.m % ti != 0
    n = _pad_columns(mm.n)
    padded = (pad_i or n != mm.n) and _pad(sch, mm, ti, pad_i, n != mm.n)
    if not padded:
        n = mm.n
    if padded:
        separate += list(sch.get_producers(red))
        epilogue = list(sch.get_consumers(red)) + epilogue  # the copy of the real rows comes first
    elif pad_i:
        ti = _largest_divisor(mm.m, TILE_I)
    writeback = sch.cache_write(red, 0, "local")  # scope set once the tile is known (_stack_tile)
    for b in epilogue[:-1]:
        try:
            sch.compute_inline(b)
        except Exception:
            separate.append(b)
    if epilogue and padded:
        # The padded write-back covers rows the output lacks, and TVM merges the epilogue into it
        # without a row test: the epilogue stays a loop nest of its own over the real rows.
        separate.append(epilogue[-1])
    elif epilogue:
        try:
            sch.reverse_compute_inline(epilogue[-1])
        except Exception:
            separate.append(epilogue[-1])
    return writeback, separate, ti, n


def _tile(sch: s_tir.Schedule, mm: Matmul, tj: int, ti: int) -> tuple[Any, list[Any], Any, Any]:
    """Split and order the loops; the fused parallel loop, the reduction loops, the i and j tile loops."""
    i, j, n_s = mm.i, mm.j, mm.n_s
    loops = sch.get_loops(mm.block)
    s_loops, r_loops = loops[:n_s], loops[n_s:]
    jo, ji = sch.split(s_loops[j], [None, tj])
    outer = [s_loops[k] for k in range(n_s) if k not in (i, j)]
    ii = None
    if i >= 0:
        io, ii = sch.split(s_loops[i], [None, ti])
        # j tiles outside i tiles: one K x tj panel of the j-dependent operand (weights)
        # stays in L2 while every i tile streams past it; i outside j re-streamed the whole
        # weight matrix per i tile.
        outer += [jo, io]
        inner = [ii, ji]
    else:
        outer += [jo]
        inner = [ji]
    if i >= 0 and _split_k(sch, outer, r_loops, mm.m, tj):
        # k blocks outside i tiles: an i tile's A rows and the weight panel's k block stay
        # in L1/L2; the accumulator becomes an m x tj local block.
        ko, ki = sch.split(r_loops[0], [None, K_BLOCK])
        sch.reorder(*outer[:-1], ko, outer[-1], ki, *inner)
        fused = sch.fuse(*outer[:-1])
        r_loops = [ko]
    else:
        sch.reorder(*outer, *r_loops, *inner)
        fused = sch.fuse(*outer)
    return fused, r_loops, ii, ji


def _vectorize(sch: s_tir.Schedule, red: Any, writeback: Any, r_loop: Any, ii: Any, ji: Any, vec: int) -> None:
    """Vectorize the j lanes, unroll the tile, and vectorize the accumulator's init and write-back."""
    jv_o, jv = sch.split(ji, [None, vec])
    sch.vectorize(jv)
    sch.unroll(jv_o)
    if ii is not None:
        sch.unroll(ii)
    init = sch.decompose_reduction(red, r_loop)
    init_loops = sch.get_loops(init)
    sch.vectorize(sch.split(init_loops[-1], [None, vec])[1])
    # Only the j loop is split for vectors: its extent is a multiple of vec.
    wb_loops = sch.get_loops(writeback)[1:]
    sch.vectorize(sch.split(wb_loops[-1], [None, vec])[1])


#: TVM puts a kernel's buffer on the stack only when it is global-scope and under 1 KiB
#: (``kMaxStackAlloca``); a local one is a ``TVMBackendAllocWorkspace`` / ``FreeWorkspace`` pair
#: around every tile.
STACK_BYTES = 1024


def _stack_tile(sch: s_tir.Schedule, block: Any, tile_bytes: int) -> None:
    """Move the accumulator tile ``block`` writes to the stack when it is small enough to go there."""
    if tile_bytes < STACK_BYTES:
        sch.set_scope(block, 0, "global")


class TiledMatmul(CpuRule):
    """8x32 register tile with a local accumulator and a fused epilogue."""

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        tile_j = _tile_j(target)
        sch = s_tir.Schedule(func)
        infos = dl.normalize_prim_func(sch)
        mm = match(sch, infos) if infos is not None else None
        if infos is None or mm is None:
            return None
        ti = _i_tile(mm.m) if mm.i >= 0 else 1
        writeback, separate, ti, n = _inline_neighbours(sch, infos, mm, ti)
        vec = _vector_width(n)
        tj = _largest_divisor(n, max(tile_j, vec), vec) or vec
        packed = pack_weight(sch, mm, func, tj)
        if packed is not None:
            sch = packed
        fused, r_loops, ii, ji = _tile(sch, mm, tj, ti)
        _stack_tile(sch, mm.block, ti * tj * 4)
        if mm.macs >= PARALLEL_MIN_MACS:
            sch.parallel(fused)
        sch.reverse_compute_at(writeback, fused)
        _vectorize(sch, mm.block, writeback, r_loops[0], ii, ji, vec)
        for b in separate:
            schedule_spatial_block(sch, b)
        return mark_packed(sch) if packed is not None else sch
