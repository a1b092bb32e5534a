# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""A u8 x s8 -> i32 dense kernel on AVX-512 VNNI (``vpdpbusd``), weights pre-packed.

``vpdpbusd`` multiplies 4 unsigned activation bytes with 4 signed weight bytes in each of
16 int32 lanes and accumulates: 64 multiply-adds per instruction, 4x an fp32 FMA. It wants
the weight as ``[N/16, K/4, 16, 4]`` (``pack_weight``), which the caller does once at compile
time for a constant weight; the activation row's 4 bytes are broadcast to all lanes.

The kernel is ``out[m, n] = sum_k a[m, k] * w[k, n] - za * colsum[n]``: the activation's
zero point folds into one per-column constant (``colsum = sum_k w[k, n]``), so the
inner loop never widens or subtracts.

TVM ships a VNNI tensor intrinsic, but its ``C`` buffer is global-scope only (a local
accumulator tile cannot match it) and it calls ``vpdpbusd`` with the ``<16 x i32>`` operands
of LLVM < 17 (0.27's LLVM verifier rejects them): hence this module's own intrinsic.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import s_tir, te
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from aotforge.targets.tvm.kernels.nhwc_input import OPAQUE
from aotforge.targets.tvm.schedules.matmul import PARALLEL_MIN_MACS

LANES = 16
GROUP = 4
#: An 8 x 48 tile of int32 accumulators: 24 of the 32 zmm registers (best of 8x2..8x4, 4x4..4x6).
TILE_M = 8
TILE_N_VECTORS = 3
INTRIN = "aotforge_vnni_dot_16x4_local"
INTRIN_STACK = "aotforge_vnni_dot_16x4_global"
#: TVM puts a kernel's buffer on the stack only when it is global-scope and under 1 KiB
#: (``kMaxStackAlloca``); a local-scope one, or a bigger one, is a ``TVMBackendAllocWorkspace`` /
#: ``FreeWorkspace`` pair around every tile (MobileNet-style int8: ~1,000 pairs a call).
STACK_BYTES = 1024


def _dot_16x4(scope: str) -> tuple[Any, Any]:
    """The 16 x 4 dot's description and its ``vpdpbusd`` implementation, ``C`` in ``scope``."""

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((16, 4), "int8", offset_factor=1),
        C: T.Buffer((16,), "int32", offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def vnni(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((16, 4), "int8", offset_factor=1),
        C: T.Buffer((16,), "int32", offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            # The 4 activation bytes as one int32, inline: bound to a name, TVM 0.27 gives it a 4-byte
            # workspace (a TVMBackendAllocWorkspace / FreeWorkspace pair per tile).
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16), dtype="uint8x64"),
                B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16",
            )

    return desc, vnni


def register_intrinsic() -> None:
    for name, scope in ((INTRIN, "local"), (INTRIN_STACK, "global")):
        try:
            TensorIntrin.get(name)
        except Exception:  # not registered yet in this process
            TensorIntrin.register(name, *_dot_16x4(scope))


def supports(m: int, k: int, n: int) -> str:
    """Why the kernel cannot take this shape ('' when it can)."""
    if k % GROUP:
        return f"K={k} is not a multiple of {GROUP}"
    if n % LANES:
        return f"N={n} is not a multiple of {LANES}"
    if m < 1:
        return f"M={m}"
    return ""


def pack_weight(w: np.ndarray) -> np.ndarray:
    """``[K, N]`` int8 -> ``[N/16, K/4, 16, 4]``: one ``vpdpbusd`` operand per 64 contiguous bytes."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k // GROUP, GROUP, n // LANES, LANES).transpose(2, 0, 3, 1))


def largest_divisor(n: int, limit: int) -> int:
    return next(d for d in range(min(n, limit), 0, -1) if n % d == 0)


def dense_u8s8(m: int, k: int, n: int) -> Any:
    """The scheduled PrimFunc ``(a u8[m,k], w_packed s8, za u8[], colsum i32[n]) -> i32[m,n]``."""
    register_intrinsic()
    a = te.placeholder((m, k), "uint8", name="a")
    w = te.placeholder((n // LANES, k // GROUP, LANES, GROUP), "int8", name="w_packed")
    za = te.placeholder((), "uint8", name="za")
    colsum = te.placeholder((n,), "int32", name="colsum")
    r = te.reduce_axis((0, k), name="k")
    acc = te.compute(
        (m, n),
        lambda i, j: te.sum(
            a[i, r].astype("int32") * w[j // LANES, r // GROUP, j % LANES, r % GROUP].astype("int32"), axis=r
        ),
        name="acc",
    )
    out = te.compute((m, n), lambda i, j: acc[i, j] - za[()].astype("int32") * colsum[j], name="out")
    sch = s_tir.Schedule(te.create_prim_func([a, w, za, colsum, out]))
    block = sch.get_sblock("acc")
    i, j, kk = sch.get_loops(block)
    jv, jl = sch.split(j, [None, LANES])
    ko, ki = sch.split(kk, [None, GROUP])
    io, ii = sch.split(i, [None, largest_divisor(m, TILE_M)])
    jo, ji = sch.split(jv, [None, largest_divisor(n // LANES, TILE_N_VECTORS)])
    # j tiles outside i tiles: the weight panel stays in cache while the rows stream past.
    sch.reorder(jo, io, ko, ii, ji, jl, ki)
    return finish_tile(sch, block, sch.get_sblock("out"), parallel=[jo, io], reduction=ko, lanes=jl, tile=[ii, ji])


#: A kernel under this many multiply-adds runs on the calling thread, as the fp32 rule's
#: (``schedules.matmul.PARALLEL_MIN_MACS``) at VNNI's 4x the multiply-adds per instruction: TVM
#: splits a parallel loop statically, so each launch waits for its slowest thread, and on a loaded
#: machine for a descheduled worker's time slice: many tiny parallel launches then cost more than the
#: kernels themselves. Figures: docs/benchmarks.md (make bench-models).
VNNI_PARALLEL_MIN_MACS = 4 * PARALLEL_MIN_MACS


def _macs(sch: s_tir.Schedule, block: Any) -> int:
    """The block's instances (a reduction's multiply-adds): the product of its loops' extents."""
    count = 1
    for loop in sch.get_loops(block):
        count *= int(sch.get(loop).extent)
    return count


def finish_tile(
    sch: s_tir.Schedule, block: Any, epilogue: Any, *, parallel: list[Any], reduction: Any, lanes: Any, tile: list[Any]
) -> Any:
    """The steps every VNNI kernel shares once its loops are ordered ``parallel.., reduction.., tile.., lanes``.

    The accumulator tile goes to a buffer of its own whose write-back carries ``epilogue`` (the
    zero-point correction), on the stack when it is small enough (``STACK_BYTES``); the 16 x 4
    lanes become one ``vpdpbusd``; the tile loops unroll.
    """
    tile_bytes = 4 * LANES
    for loop in tile:
        tile_bytes *= int(sch.get(loop).extent)
    on_stack = tile_bytes < STACK_BYTES
    writeback = sch.cache_write(block, 0, "global" if on_stack else "local")
    sch.reverse_compute_inline(epilogue)
    outer = sch.fuse(*parallel)
    if _macs(sch, block) >= VNNI_PARALLEL_MIN_MACS:
        sch.parallel(outer)
    sch.reverse_compute_at(writeback, outer)
    init = sch.decompose_reduction(block, reduction)
    sch.tensorize(lanes, INTRIN_STACK if on_stack else INTRIN)
    for loop in tile:
        sch.unroll(loop)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.split(sch.get_loops(writeback)[-1], [None, LANES])[1])
    # Opaque to FuseOps, as the tensorized block alone no longer makes it: fused with the elementwise
    # ops after it, FuseTIR would make a new PrimFunc of the two (and fails on the VNNI buffers).
    return sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)
