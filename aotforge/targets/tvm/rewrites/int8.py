"""Relax pass: integer matmuls and QDQ convolutions with constant int8 weights -> VNNI (tvm target).

The ONNX importer turns ``MatMulInteger(a_u8, w_s8, za, wz)`` (what ``int8-dynamic`` emits)
into ``matmul(astype(a, i32) - astype(za, i32), astype(w, i32) [- wz], out_dtype=i32)``: an
int32 GEMM, slower than fp32. Where the weight is a constant with zero (or no) zero points
and the activation is uint8 with a scalar zero point, the call becomes
``targets.tvm.kernels.vnni_dense`` on the weight packed at compile time. Everything else
is left alone and counted, with the reason, in the report. QDQ convolutions (static ``int8``)
go through ``targets.tvm.rewrites.int8_conv``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from aotforge.targets.tvm.relax_util import op_name, relax_functions, rewrite_functions


def _static_shape(expr: Any) -> list[int] | None:
    shape = getattr(expr.ty, "shape", None)
    if shape is None:
        return None
    try:
        return [int(d) for d in shape]
    except TypeError:  # a symbolic dim
        return None


def candidate(call: Any, bound: Callable[[Any], Any]) -> str:
    """``"matmul"`` / ``"conv2d"`` for a call the rewrite looks at (``bound`` resolves a var), else ``""``."""
    if op_name(call) == "relax.matmul" and str(getattr(call.ty, "dtype", "")) == "int32":
        return "matmul"
    if op_name(call) == "relax.nn.conv2d" and all(op_name(bound(arg)) == "relax.dequantize" for arg in call.args[:2]):
        return "conv2d"
    return ""


def count_integer_ops(mod: Any) -> int:
    """How many int32-accumulating matmuls and QDQ convolutions ``mod``'s Relax functions hold."""
    from tvm import relax

    count = 0
    for _, func in relax_functions(mod):
        bindings = relax.analysis.get_var2val(func)

        def visit(expr: Any, bindings: Any = bindings) -> None:
            nonlocal count
            count += bool(candidate(expr, lambda v: bindings.get(v, v)))

        relax.analysis.post_order_visit(func, visit)
    return count


def rewrite_integer_ops(mod: Any) -> tuple[Any, dict[str, Any] | None]:
    """Rewrite every matching integer matmul and QDQ convolution of ``mod``; what happened, or
    ``None`` (nothing to report) for a graph with neither."""
    import tvm
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    from aotforge.targets.tvm.kernels import vnni_conv, vnni_dense
    from aotforge.targets.tvm.rewrites import int8_conv as conv

    skipped: Counter[str] = Counter()
    rewritten: Counter[str] = Counter()
    kernels: dict[tuple[Any, ...], Any] = {}

    def constant(expr: Any) -> np.ndarray | None:
        return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None

    @expr_functor.mutator
    class _Mutator(PyExprMutator):  # type: ignore[misc]
        def _bound(self, expr: Any) -> Any:
            return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

        def _activation(self, lhs: Any) -> tuple[Any, Any] | str:
            """``(a_u8, za)`` from ``astype(a) - astype(za)`` or ``astype(a)``, else why not."""
            expr = self._bound(lhs)
            za: Any = None
            if op_name(expr) == "relax.subtract":
                za_expr = self._bound(expr.args[1])
                if op_name(za_expr) != "relax.astype" or _static_shape(za_expr.args[0]) != []:
                    return "activation zero point is not a scalar"
                za = za_expr.args[0]
                expr = self._bound(expr.args[0])
            if op_name(expr) != "relax.astype":
                return "activation is not a widened integer tensor"
            a = expr.args[0]
            if str(a.ty.dtype) != "uint8" or (za is not None and str(za.ty.dtype) != "uint8"):
                return "activation is not uint8"
            return a, za

        def _weight(self, rhs: Any) -> np.ndarray | str:
            """The int8 weight as numpy when it is a constant with zero zero points, else why not."""
            expr = self._bound(rhs)
            if op_name(expr) == "relax.subtract":
                zp = self._bound(expr.args[1])
                while op_name(zp) in ("relax.astype", "relax.expand_dims"):
                    zp = self._bound(zp.args[0])
                zero = constant(zp)
                if zero is None or np.any(zero != 0):
                    return "weight zero point is not a constant zero"
                expr = self._bound(expr.args[0])
            w = constant(self._bound(expr.args[0])) if op_name(expr) == "relax.astype" else None
            if w is None:
                return "weight is not a constant"
            if w.dtype != np.int8 or w.ndim != 2:
                return "weight is not a 2-D int8 tensor"
            return w

        def _dense(self, a: Any, za: Any, weight: np.ndarray) -> Any:
            """``a u8[m, k] x weight s8[k, n] - za * colsum`` on the VNNI kernel, as an i32 ``[m, n]``."""
            m, k = _static_shape(a) or []
            n = weight.shape[1]
            if (m, k, n) not in kernels:
                name = f"vnni_dense_{m}x{k}x{n}"
                func = vnni_dense.dense_u8s8(m, k, n).with_attr("global_symbol", name)
                kernels[(m, k, n)] = self.builder_.add_func(func, name)
            colsum = weight.astype(np.int32).sum(axis=0, dtype=np.int32)
            args = [a, relax.const(vnni_dense.pack_weight(weight)), za, relax.const(colsum)]
            return self.builder_.emit(relax.call_tir(kernels[(m, k, n)], args, relax.TensorType([m, n], "int32")))

        def _matmul(self, call: Any) -> Any:
            activation = self._activation(call.args[0])
            weight = self._weight(call.args[1])
            shape = _static_shape(call.args[0])
            why = activation if isinstance(activation, str) else weight if isinstance(weight, str) else ""
            if not why and shape is None:
                why = "activation shape is symbolic"
            if not why:
                assert not isinstance(weight, str) and shape is not None
                why = vnni_dense.supports(int(np.prod(shape[:-1])), *weight.shape)
            if why:
                skipped[why] += 1
                return call
            assert not isinstance(activation, str) and not isinstance(weight, str) and shape is not None
            a, za = activation
            m, n = int(np.prod(shape[:-1])), weight.shape[1]
            a2 = self.builder_.emit(relax.op.reshape(a, [m, shape[-1]])) if len(shape) != 2 else a
            out = self._dense(a2, za if za is not None else relax.const(np.uint8(0), "uint8"), weight)
            rewritten["matmul"] += 1
            return relax.op.reshape(out, [*shape[:-1], n]) if len(shape) != 2 else out

        def _conv(self, call: Any) -> Any:
            x, w = self._bound(call.args[0]), self._bound(call.args[1])
            q, s, z = x.args
            weight, sw, zw = (constant(self._bound(e)) for e in w.args)
            x_shape, w_shape = _static_shape(q), _static_shape(w)
            why = ""
            scale, zero = constant(s), constant(z)
            if str(q.ty.dtype) != "uint8" or scale is None or zero is None or scale.size != 1 or zero.size != 1:
                why = "convolution input is not uint8 with one constant scale and zero point"
            elif weight is None or sw is None or zw is None or weight.dtype != np.int8 or np.any(zw != 0):
                why = "convolution weight is not a constant symmetric int8 tensor"
            elif x_shape is None or w_shape is None:
                why = "convolution shape is symbolic"
            shape = why or conv.conv_shape(call, x_shape or [], w_shape or [])
            if isinstance(shape, str):
                skipped[shape] += 1
                return call
            assert weight is not None and sw is not None
            assert scale is not None and zero is not None
            zero_point = relax.const(zero.reshape(()).astype(np.uint8))
            pad = functools.partial(conv.pad_channels_last, shape=shape)
            padded = self.builder_.emit(self.builder_.call_te(pad, q, zero_point, primfunc_name_hint="pad_nhwc"))
            oh, ow = shape.out_hw
            key = ("conv", *shape.padded_hw, shape.channels, shape.o, shape.kh, shape.kw, *shape.strides, shape.n)
            if key not in kernels:
                name = "vnni_conv2d_" + "x".join(str(v) for v in key[1:])
                func = vnni_conv.conv2d_u8s8(
                    shape.n, *shape.padded_hw, shape.channels, shape.o, shape.kh, shape.kw, shape.strides, (oh, ow)
                )
                kernels[key] = self.builder_.add_func(func.with_attr("global_symbol", name), name)
            colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
            packed = relax.const(vnni_conv.pack_weight(weight, shape.channels))
            out = self.builder_.emit(
                relax.call_tir(
                    kernels[key],
                    [padded, packed, zero_point, relax.const(colsum)],
                    relax.TensorType([shape.n, oh, ow, shape.o], "int32"),
                )
            )
            per_channel = (np.float32(scale.reshape(())) * np.broadcast_to(sw, (shape.o,))).astype(np.float32)
            nhwc = self.builder_.emit(relax.op.multiply(relax.op.astype(out, "float32"), relax.const(per_channel)))
            rewritten["conv2d"] += 1
            return relax.op.permute_dims(nhwc, [0, 3, 1, 2])

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            kind = candidate(call, self._bound)
            return self._matmul(call) if kind == "matmul" else self._conv(call) if kind == "conv2d" else call

    # The int32 widening of each rewritten weight is dead afterwards; drop it before legalization.
    mod = relax.transform.DeadCodeElimination()(rewrite_functions(_Mutator, mod))
    report = {"rewritten": sum(rewritten.values()), "by_op": dict(rewritten), "kernels": len(kernels)}
    return mod, {**report, "skipped": dict(skipped)} if rewritten or skipped else None
