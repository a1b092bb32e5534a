# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""A u8 x s8 -> i32 dense kernel on Intel AMX (``tdpbusd``), on the VNNI kernel's packed weights.

One ``tdpbusd`` multiplies a 16 x 64 u8 tile by a 64 x 16 s8 tile into a 16 x 16 i32 tile:
16,384 multiply-adds, 64 ``vpdpbusd``'s worth, so at BERT-sized shapes it beats the VNNI kernel and
ONNX Runtime's MLAS (figures: docs/benchmarks.md).

The B tile wants 16 rows of 16 columns x 4 k-bytes: ``vnni_dense.pack_weight``'s
``[N/16, K/4, 16, 4]`` gives exactly that, 1 KiB contiguous per (16 columns, 64 k) block. A tiles
load straight from the row-major activation (stride K). Each 32 x 32 output block keeps 4
accumulator tiles (2 x 2) in the 8 tile registers with 2 A and 2 B tiles; the block is stored to
the output and the zero-point correction (``za * colsum``, as in ``vnni_dense``) applied in place.

Tile registers are per-thread state: each parallel task loads the tile configuration
(``ldtilecfg``) and releases it. Linux gives a process AMX state only after
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` (else the first tile instruction is
SIGILL); the grant covers every thread of the process and stays, so the kernel does not ask:
``host.amx_usable`` asks, once per process, when the build picks AMX and when the tvm target loads
a ``lib.so`` built with it (``host.grant_amx``; a host that refuses is refused at load, naming
amx-int8). A ``lib.so`` opened outside aotforge needs the same call first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm.script import tirx as T

from aotforge.targets.tvm.kernels.nhwc_input import OPAQUE
from aotforge.targets.tvm.kernels.vnni_dense import VNNI_PARALLEL_MIN_MACS

#: rows, columns and k of one 2 x 2 block of 16 x 16 tiles
BLOCK_M = 32
BLOCK_N = 32
BLOCK_K = 64


def supports(m: int, k: int, n: int) -> str:
    """Why the kernel cannot take this shape ('' when it can; rows are padded to ``BLOCK_M``)."""
    if k % BLOCK_K:
        return f"K={k} is not a multiple of {BLOCK_K}"
    if n % BLOCK_N:
        return f"N={n} is not a multiple of {BLOCK_N}"
    if m < BLOCK_M:
        return f"M={m} is under one {BLOCK_M}-row block"
    return ""


def tile_config() -> np.ndarray:
    """``ldtilecfg``'s 64 bytes: palette 1, tiles 0-7 of 16 rows x 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    cfg[16:32].view(np.uint16)[:8] = 64
    cfg[48:56] = 16
    return cfg


def _tile(name: str, *args: Any) -> Any:
    """A call of tile instruction ``name`` (tile operands are immediates: unrolled loop indices)."""
    return T.call_llvm_intrin("void", f"llvm.x86.{name}", *args)


def dense_u8s8(m: int, k: int, n: int) -> Any:
    """``(a u8[m,k], w_packed s8[n/16,k/4,16,4], za u8[], colsum i32[n], cfg u8[64]) -> i32[m,n]``, ``m`` a
    multiple of ``BLOCK_M``."""
    steps, rows, cols = k // BLOCK_K, m // BLOCK_M, n // BLOCK_N
    loop = T.parallel if m * k * n >= VNNI_PARALLEL_MIN_MACS else T.serial

    @T.prim_func(s_tir=True)
    def main(
        a: T.Buffer((m, k), "uint8"),
        w: T.Buffer((n // 16, k // 4, 16, 4), "int8"),
        za: T.Buffer((), "uint8"),
        colsum: T.Buffer((n,), "int32"),
        cfg: T.Buffer((64,), "uint8"),
        out: T.Buffer((m, n), "int32"),
    ) -> None:
        T.func_attr({"tirx.noalias": True})
        for jb in loop(cols):
            _tile("ldtilecfg", T.address_of(cfg[0]))
            for ib in T.serial(rows):
                for t in T.unroll(4):
                    _tile("tilezero", T.Cast("uint8", t))
                for kb in T.serial(steps):
                    for h in T.unroll(2):
                        _tile(
                            "tileloadd64",
                            T.Cast("uint8", 4 + h),
                            T.address_of(a[ib * 32 + h * 16, kb * 64]),
                            T.int64(k),
                        )
                        _tile(
                            "tileloadd64",
                            T.Cast("uint8", 6 + h),
                            T.address_of(w[jb * 2 + h, kb * 16, 0, 0]),
                            T.int64(64),
                        )
                    for t in T.unroll(4):
                        _tile("tdpbusd", T.Cast("uint8", t), T.Cast("uint8", 4 + t // 2), T.Cast("uint8", 6 + t % 2))
                for t in T.unroll(4):
                    _tile(
                        "tilestored64",
                        T.Cast("uint8", t),
                        T.address_of(out[ib * 32 + t // 2 * 16, jb * 32 + t % 2 * 16]),
                        T.int64(n * 4),
                    )
                for i in T.serial(32):
                    for j in T.vectorized(32):
                        out[ib * 32 + i, jb * 32 + j] = (
                            out[ib * 32 + i, jb * 32 + j] - T.Cast("int32", za[()]) * colsum[jb * 32 + j]
                        )
            _tile("tilerelease")

    # Opaque to FuseOps, as vnni_dense's kernels: fused with the row padding before it, FuseTIR fails.
    return main.with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)
