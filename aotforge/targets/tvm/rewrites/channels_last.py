"""Keep a quantized CNN channels-last between the integer kernels (tvm target, ``int8_vnni`` rewrites).

The integer convolution kernels read and write NHWC. The graph around them is NCHW, and Relax's
``ConvertLayout`` cannot carry NHWC through it: ``quantize`` / ``dequantize`` have no layout
inference, so every conv epilogue went back to NCHW and every next conv's input forward to NHWC
again, a transpose each way (and the float ops in between, NCHW). Here the rewrite keeps a
*twin* for each NCHW value it can compute channels-last: a kernel's output has one, and an
elementwise op (bias add, requantize, dequantize, residual add, ReLU6's bounds) whose tensor
operands all have twins, or broadcast over H and W (a ``[1, C, 1, 1]`` bias, a scalar), gets one
by running on the twins. Each twinned NCHW value is bound as ``permute_dims`` of its twin, so
where nothing needs NCHW, dead-code elimination drops the transpose; the next integer kernel
reads the twin. A global mean over H and W reads the twin too (its result has no spatial axes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aotforge.targets.tvm.relax_util import constant_value, op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule

TO_NCHW = [0, 3, 1, 2]
TO_NHWC = [0, 2, 3, 1]

#: Ops computed element by element (with broadcasting), whatever the layout.
_ELEMENTWISE = frozenset(
    {
        "relax.add",
        "relax.subtract",
        "relax.multiply",
        "relax.divide",
        "relax.maximum",
        "relax.minimum",
        "relax.astype",
        "relax.clip",
        "relax.nn.relu",
        "relax.quantize",
        "relax.dequantize",
    }
)


class Twins:
    """NCHW vars of the function being rewritten -> the NHWC var holding the same values."""

    def __init__(self) -> None:
        self._nhwc: dict[Any, Any] = {}

    def of(self, expr: Any, bound: Callable[[Any], Any]) -> Any | None:
        """The NHWC twin of ``expr`` (following var-to-var bindings), or ``None``."""
        from tvm import relax

        while isinstance(expr, relax.Var):
            if expr in self._nhwc:
                return self._nhwc[expr]
            value = bound(expr)
            if value is None or value.same_as(expr):
                return None
            expr = value
        return None

    def emit_nchw(self, rw: Rewriter, nhwc: Any) -> Any:
        """Bind ``nhwc``'s NCHW form (a transpose dead-code elimination drops if unused) and twin them."""
        from tvm import relax

        nchw = rw.builder_.emit(relax.op.permute_dims(nhwc, TO_NCHW))
        self._nhwc[nchw] = nhwc
        return nchw


def _broadcast_over_hw(expr: Any) -> bool:
    """A tensor the same in both layouts once transposed: a scalar, all ones, or ``[N, C, 1, 1]``."""
    shape = static_shape(expr)
    if shape is None:
        return False
    return all(d == 1 for d in shape) or (len(shape) == 4 and shape[2] == shape[3] == 1)


def _is_tensor(expr: Any) -> bool:
    from tvm import relax

    return isinstance(getattr(expr, "ty", None), relax.TensorType)


class ElementwiseOnTwins(Rule):
    """An elementwise op on twinned NCHW tensors -> the same op on their NHWC twins."""

    name = "channels_last"

    def __init__(self, twins: Twins) -> None:
        self.twins = twins

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        if op_name(call) not in _ELEMENTWISE or len(static_shape(call) or []) != 4:
            return False
        tensors = [a for a in call.args if _is_tensor(a)]
        twinned = [self.twins.of(a, bound) is not None for a in tensors]
        return any(twinned) and all(t or _broadcast_over_hw(a) for a, t in zip(tensors, twinned, strict=True))

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        args = [self._nhwc_operand(a, rw) for a in call.args]
        if op_name(call) == "relax.quantize":
            nhwc = _quantize_by_reciprocal(rw, *args, out_dtype=str(call.attrs.out_dtype))
        elif op_name(call) == "relax.dequantize":  # scalar scale and zero point: any axis
            nhwc = relax.op.dequantize(*args, axis=3, out_dtype=str(call.attrs.out_dtype))
        else:
            nhwc = relax.Call(call.op, args, call.attrs, call.ty_args)
        return self.twins.emit_nchw(rw, rw.builder_.emit(nhwc))

    def _nhwc_operand(self, arg: Any, rw: Rewriter) -> Any:
        from tvm import relax

        if not _is_tensor(arg):
            return arg
        twin = self.twins.of(arg, rw.bound)
        if twin is not None:
            return twin
        shape = static_shape(arg) or []
        return relax.op.permute_dims(arg, TO_NHWC) if len(shape) == 4 and shape[1] != 1 else arg


def _quantize_by_reciprocal(rw: Rewriter, x: Any, scale: Any, zero: Any, *, out_dtype: str) -> Any:
    """``quantize(x, scale, zero)`` with a constant ``scale`` as ``quantize(x * (1 / scale), 1, zero)``.

    Relax's quantize divides every element by the scale: a ``vdivps`` per 16 elements made each
    requantizing epilogue bound by the divider, not by its memory traffic. ONNX Runtime's integer kernels
    requantize with a multiplier too; the two differ only where ``x / scale`` lies within a
    rounding error of a half-integer (one step, rarely).
    """
    from tvm import relax

    value = constant_value(scale)
    if value is None:
        return relax.op.quantize(x, scale, zero, axis=3, out_dtype=out_dtype)
    inverse = relax.const((1 / value.astype(np.float64)).astype(np.float32))
    scaled = rw.builder_.emit(relax.op.multiply(x, inverse))
    return relax.op.quantize(scaled, relax.const(np.ones_like(value)), zero, axis=3, out_dtype=out_dtype)


class SpatialMeanOnTwin(Rule):
    """``mean`` over H and W of a twinned tensor -> the mean over the twin's H and W (same result)."""

    name = "channels_last"

    def __init__(self, twins: Twins) -> None:
        self.twins = twins

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        if op_name(call) != "relax.mean" or call.attrs.axis is None:
            return False
        axes = sorted(int(a) % 4 for a in call.attrs.axis)
        return axes == [2, 3] and self.twins.of(call.args[0], bound) is not None

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        return MatchResult(self.twins.of(call.args[0], rw.bound))

    def rewrite(self, call: Any, twin: Any, rw: Rewriter) -> Any:
        from tvm import relax

        keep = bool(call.attrs.keepdims)
        mean = relax.op.mean(twin, axis=[1, 2], keepdims=keep)
        if not keep:
            return mean
        n, c = (static_shape(call) or [])[:2]
        return relax.op.reshape(rw.builder_.emit(mean), [n, c, 1, 1])
