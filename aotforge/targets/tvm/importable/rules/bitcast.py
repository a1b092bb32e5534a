"""BitCast (not in the importer) as arithmetic on the bits' values.

Between integer types of one width it is a Cast (same-width integer casts wrap: the bits stay).
Between float32 / float64 and an integer type of their width, the sign, exponent and mantissa
fields are computed exactly in int64 / float64: powers of two come from constant tables (Gather),
a float's exponent is the count of table powers at or below it, so nothing rounds. Infinities,
subnormals and -0 keep their bits; a NaN becomes the canonical quiet NaN (its payload and sign
are not visible to arithmetic), as numpy writes ``np.nan``. Integers to float64 are left alone
(refused at planning): the same graph, right through ONNX Runtime and a plain ``relax.build``,
came out wrong through the target's full pipeline (node suite: test_bitcast_int64_to_float64).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import MatchResult, NodeRule, attr, constant, np_dtype

INT64, DOUBLE = onnx.TensorProto.INT64, onnx.TensorProto.DOUBLE


@dataclasses.dataclass(frozen=True)
class _Format:
    """An IEEE binary format: exponent and mantissa widths."""

    exponent: int
    mantissa: int

    @property
    def bias(self) -> int:
        return (1 << (self.exponent - 1)) - 1

    @property
    def top(self) -> int:  # the all-ones exponent: infinities and NaN
        return (1 << self.exponent) - 1


FORMATS = {4: _Format(8, 23), 8: _Format(11, 52)}


class BitCast(NodeRule):
    """BitCast between same-width integer types, or between float32 / float64 and integers of their width."""

    report_name, ops = "bitcast", ("BitCast",)
    typed = (0,)

    def check_node(self, node: ir.Node) -> MatchResult:
        given, to = np.dtype(np_dtype(node.inputs[0])), np.dtype(onnx.helper.tensor_dtype_to_np_dtype(attr(node, "to")))
        if given.itemsize != to.itemsize or given.kind not in "iuf" or to.kind not in "iuf":
            return MatchResult().fail("not integers or floats of one width")
        if given.kind in "iu" and to.kind in "iu":
            return MatchResult()
        if given.itemsize not in FORMATS or (given.kind == "f") == (to.kind == "f"):
            return MatchResult().fail("not float32 / float64 and integers")
        if to.kind == "f" and to.itemsize == 8:  # the graph is right (ORT, relax.build), tvm's compiled kernels are not
            return MatchResult().fail("integers to float64 compile to wrong values through TVM")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, to_type = node.inputs[0], attr(node, "to")
        given, to = np.dtype(np_dtype(x)), np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to_type))
        if given.kind in "iu" and to.kind in "iu":
            return op.Cast(x, to=to_type)
        b = _Builder(op)
        fmt = FORMATS[given.itemsize]
        out = _float_to_bits(b, x, fmt, to) if given.kind == "f" else _bits_to_float(b, x, fmt, given)
        return op.Cast(out, to=to_type)


@dataclasses.dataclass
class _Builder:
    """The rewriter's op builder, with the names the bit arithmetic below reads best in."""

    builder: Any

    def const(self, value: np.ndarray) -> Any:
        return constant(self.builder, value)

    def op(self, op: str, *inputs: Any, **attrs: object) -> Any:
        return getattr(self.builder, op)(*inputs, **attrs)


def _bits_to_float(b: _Builder, x: Any, fmt: _Format, given: np.dtype) -> Any:
    """The float whose bits are ``x`` (any integer type of the width), as float64."""
    width = fmt.exponent + fmt.mantissa  # bits below the sign
    u = b.op("Cast", x, to=INT64)
    # negative (uint64 wrapped to int64 by the Cast too): the sign bit set, the rest x + 2^width (x + (2^width - 1) + 1)
    if given.kind == "i" or given.itemsize == 8:
        sign = b.op("Less", u, b.const(np.array(0, np.int64)))
        shifted = b.op(
            "Add", b.op("Add", u, b.const(np.array((1 << width) - 1, np.int64))), b.const(np.array(1, np.int64))
        )
    else:
        sign = b.op("GreaterOrEqual", u, b.const(np.array(1 << width, np.int64)))
        shifted = b.op("Sub", u, b.const(np.array(1 << width, np.int64)))
    rest = b.op("Where", sign, shifted, u)
    step = b.const(np.array(1 << fmt.mantissa, np.int64))
    exponent, mantissa = b.op("Div", rest, step), b.op("Mod", rest, step)
    zero = b.const(np.array(0, np.int64))
    normal = b.op("Greater", exponent, zero)
    significand = b.op("Where", normal, b.op("Add", mantissa, step), mantissa)
    # value = significand * 2^(e - bias - mantissa), subnormals (e = 0) at e = 1; two factors keep each in range
    powers = np.maximum(np.arange(fmt.top + 1), 1) - fmt.bias - fmt.mantissa
    first, second = (
        b.const(np.exp2(powers // 2).astype(np.float64)),
        b.const(np.exp2(powers - powers // 2).astype(np.float64)),
    )
    e = b.op("Clip", exponent, zero, b.const(np.array(fmt.top, np.int64)))
    value = b.op(
        "Mul", b.op("Mul", b.op("Cast", significand, to=DOUBLE), b.op("Gather", first, e)), b.op("Gather", second, e)
    )
    special = b.op("Where", b.op("Equal", mantissa, zero), b.const(np.array(np.inf)), b.const(np.array(np.nan)))
    magnitude = b.op("Where", b.op("Equal", exponent, b.const(np.array(fmt.top, np.int64))), special, value)
    # times -1, not Neg: -0 must come out of a zero magnitude
    return b.op("Mul", magnitude, b.op("Where", sign, b.const(np.array(-1.0)), b.const(np.array(1.0))))


def _float_to_bits(b: _Builder, x: Any, fmt: _Format, to: np.dtype) -> Any:
    """The bits of float ``x`` as an int64 holding ``to``'s value."""
    width = fmt.exponent + fmt.mantissa
    v = b.op("Cast", x, to=DOUBLE)
    zero = b.const(np.array(0.0))
    a = b.op("Abs", v)
    # sign: below zero, or -0 (1 / -0 is -inf)
    negative_zero = b.op("And", b.op("Equal", v, zero), b.op("Less", b.op("Div", b.const(np.array(1.0)), v), zero))
    sign = b.op("Or", b.op("Less", v, zero), negative_zero)
    # biased exponent: how many of 2^(1 - bias) .. 2^(top - 1 - bias) are <= |x| (0: subnormal or zero)
    thresholds = np.exp2(np.arange(1, fmt.top) - fmt.bias).astype(np.float64)
    at_least = b.op("GreaterOrEqual", b.op("Unsqueeze", a, b.const(np.array([-1], np.int64))), b.const(thresholds))
    exponent = b.op("ReduceSum", b.op("Cast", at_least, to=INT64), b.const(np.array([-1], np.int64)), keepdims=0)
    # mantissa: |x| * 2^(bias + mantissa - e) (e = 0 scaled as e = 1), less the implicit bit; two factors for range
    powers = fmt.bias + fmt.mantissa - np.maximum(np.arange(fmt.top + 1), 1)
    first, second = (
        b.const(np.exp2(powers // 2).astype(np.float64)),
        b.const(np.exp2(powers - powers // 2).astype(np.float64)),
    )
    finite = b.op("Where", b.op("IsInf", a), zero, b.op("Where", b.op("IsNaN", a), zero, a))
    scaled = b.op("Mul", b.op("Mul", finite, b.op("Gather", first, exponent)), b.op("Gather", second, exponent))
    step = b.const(np.array(1 << fmt.mantissa, np.int64))
    zero64 = b.const(np.array(0, np.int64))
    implicit = b.op("Where", b.op("Greater", exponent, zero64), step, zero64)
    mantissa = b.op("Sub", b.op("Cast", scaled, to=INT64), implicit)
    top = b.const(np.array(fmt.top, np.int64))
    exponent = b.op("Where", b.op("IsInf", a), top, b.op("Where", b.op("IsNaN", a), top, exponent))
    quiet = b.const(np.array(1 << (fmt.mantissa - 1), np.int64))
    mantissa = b.op("Where", b.op("IsNaN", a), quiet, b.op("Where", b.op("IsInf", a), zero64, mantissa))
    rest = b.op("Add", b.op("Mul", exponent, step), mantissa)
    # the sign bit set: rest - 2^width, in range for int64 (uint64 wraps back in the final Cast)
    if to.kind == "i" or to.itemsize == 8:
        signed = b.op("Add", rest, b.const(np.array(-(1 << width), np.int64)))
    else:
        signed = b.op("Add", rest, b.const(np.array(1 << width, np.int64)))
    return b.op("Where", sign, signed, rest)
