"""int8 rule: an integer matmul with a constant int8 weight -> the VNNI dense kernel.

The ONNX importer turns ``MatMulInteger(a_u8, w_s8, za, wz)`` (what ``int8-dynamic`` emits)
into ``matmul(astype(a, i32) - astype(za, i32), astype(w, i32) [- wz], out_dtype=i32)``: an
int32 GEMM, slower than fp32. Where the weight is a constant with zero (or no) zero points and
the activation is uint8 with a scalar zero point, the call becomes
``targets.tvm.kernels.vnni_dense`` on the weight packed at compile time, or, on a target with
AMX int8 tiles (``amx=True``) and a shape they take, ``targets.tvm.kernels.amx_dense`` on the
same packed weight (AMX multiplies a tile per instruction where VNNI multiplies a vector).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from aotforge.targets.tvm.kernels import amx_dense, vnni_dense
from aotforge.targets.tvm.relax_util import constant_value, dtype_of, op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule

#: Row tiles below this many rows pad the rows instead (ragged token counts).
MIN_ROW_TILE = 4


@dataclasses.dataclass(frozen=True)
class DenseMatch:
    """``a`` u8 (any rank, static), its scalar zero point ``za`` (``None``: 0), the ``[K, N]`` int8 weight."""

    a: Any
    za: Any
    weight: np.ndarray
    shape: list[int]


def activation(lhs: Any, bound: Callable[[Any], Any]) -> MatchResult[tuple[Any, Any]]:
    """``(a_u8, za)`` from ``astype(a) - astype(za)`` or ``astype(a)``."""
    expr = bound(lhs)
    za: Any = None
    if op_name(expr) == "relax.subtract":
        za_expr = bound(expr.args[1])
        if op_name(za_expr) != "relax.astype" or static_shape(za_expr.args[0]) != []:
            return MatchResult.fail("activation zero point is not a scalar")
        za = za_expr.args[0]
        expr = bound(expr.args[0])
    if op_name(expr) != "relax.astype":
        return MatchResult.fail("activation is not a widened integer tensor")
    a = expr.args[0]
    if str(a.ty.dtype) != "uint8" or (za is not None and str(za.ty.dtype) != "uint8"):
        return MatchResult.fail("activation is not uint8")
    return MatchResult((a, za))


def weight(rhs: Any, bound: Callable[[Any], Any]) -> MatchResult[np.ndarray]:
    """The int8 weight as numpy, when it is a constant whose zero points are all zero."""
    expr = bound(rhs)
    if op_name(expr) == "relax.subtract":
        zp = bound(expr.args[1])
        while op_name(zp) in ("relax.astype", "relax.expand_dims"):
            zp = bound(zp.args[0])
        zero = constant_value(zp)
        if zero is None or np.any(zero != 0):
            return MatchResult.fail("weight zero point is not a constant zero")
        expr = bound(expr.args[0])
    w = constant_value(bound(expr.args[0])) if op_name(expr) == "relax.astype" else None
    if w is None:
        return MatchResult.fail("weight is not a constant")
    if w.dtype != np.int8 or w.ndim != 2:
        return MatchResult.fail("weight is not a 2-D int8 tensor")
    return MatchResult(w)


class IntegerMatmulToVnni(Rule):
    name = "matmul"

    def __init__(self, *, amx: bool = False) -> None:
        self.amx = amx
        #: each uint8 activation as a kernel reads it (``_rows``: by row count), emitted once
        self._rows: dict[tuple[Any, int], Any] = {}

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.matmul" and dtype_of(call) == "int32"

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        act = activation(call.args[0], rw.bound)
        if not act:
            return act
        w = weight(call.args[1], rw.bound)
        if not w:
            return w
        shape = static_shape(call.args[0])
        if shape is None:
            return MatchResult.fail("activation shape is symbolic")
        assert act.value is not None and w.value is not None
        why = vnni_dense.supports(int(np.prod(shape[:-1])), *w.value.shape)
        if why:
            return MatchResult.fail(why)
        return MatchResult(DenseMatch(*act.value, w.value, shape))

    def rewrite(self, call: Any, match: DenseMatch, rw: Rewriter) -> Any:
        from tvm import relax

        shape = match.shape
        (m, k), n = (int(np.prod(shape[:-1])), shape[-1]), match.weight.shape[1]
        amx = self.amx and not amx_dense.supports(m, k, n)
        rows = -(-m // amx_dense.BLOCK_M) * amx_dense.BLOCK_M if amx else _vnni_rows(m)
        if (match.a, rows) not in self._rows:  # Q, K and V read one activation: reshape and pad it once
            self._rows[match.a, rows] = _rows(rw, match.a, m, k, rows)
        za = match.za if match.za is not None else relax.const(np.uint8(0), "uint8")
        out = _dense(rw, self._rows[match.a, rows], m, za, match.weight, amx=amx)
        return relax.op.reshape(out, [*shape[:-1], n]) if len(shape) != 2 else out


def _vnni_rows(m: int) -> int:
    """``m`` rows padded to whole VNNI row tiles where it is ragged (ViT's 37 tokens, a prime, left no
    row tile but 1, and every vpdpbusd reloaded its weights)."""
    return m if vnni_dense.largest_divisor(m, vnni_dense.TILE_M) >= MIN_ROW_TILE else -(-m // 8) * 8


def _rows(rw: Rewriter, a: Any, m: int, k: int, rows: int) -> Any:
    """``a`` as the kernel's ``[rows, k]``: 2-D, its ``m`` rows padded to ``rows``."""
    from tvm import relax

    if len(static_shape(a) or []) != 2:
        a = rw.builder_.emit(relax.op.reshape(a, [m, k]))
    return rw.builder_.emit(relax.op.nn.pad(a, [0, rows - m, 0, 0])) if rows != m else a


def _dense(rw: Rewriter, a: Any, m: int, za: Any, weight: np.ndarray, *, amx: bool) -> Any:
    """``a u8[rows, k] x weight s8[k, n] - za * colsum`` on the VNNI or AMX kernel: its first ``m`` rows, i32."""
    from tvm import relax

    rows, k = static_shape(a) or []
    n = weight.shape[1]
    colsum = weight.astype(np.int32).sum(axis=0, dtype=np.int32)
    args = [a, relax.const(vnni_dense.pack_weight(weight)), za, relax.const(colsum)]
    if amx:
        kernel = rw.add_kernel(f"amx_dense_{rows}x{k}x{n}", lambda: amx_dense.dense_u8s8(rows, k, n))
        args.append(relax.const(amx_dense.tile_config()))
    else:
        kernel = rw.add_kernel(f"vnni_dense_{rows}x{k}x{n}", lambda: vnni_dense.dense_u8s8(rows, k, n))
    out = rw.builder_.emit(relax.call_tir(kernel, args, relax.TensorType([rows, n], "int32")))
    return out if rows == m else rw.builder_.emit(relax.op.strided_slice(out, [0], [0], [m]))
