"""Relax pass: integer matmuls with a constant int8 weight -> the VNNI kernel (tvm target).

The ONNX importer turns ``MatMulInteger(a_u8, w_s8, za, wz)`` (what ``int8-dynamic`` emits)
into ``matmul(astype(a, i32) - astype(za, i32), astype(w, i32) [- wz], out_dtype=i32)``: an
int32 GEMM, slower than fp32. Where the weight is a constant with zero (or no) zero points
and the activation is uint8 with a scalar zero point, the call becomes
``targets.tvm_schedules.vnni_dense`` on the weight packed at compile time. Everything else
is left alone and counted, with the reason, in the report.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np


def _op(expr: Any) -> str:
    from tvm import relax

    return str(expr.op.name) if isinstance(expr, relax.Call) and hasattr(expr.op, "name") else ""


def _static_shape(expr: Any) -> list[int] | None:
    shape = getattr(expr.ty, "shape", None)
    if shape is None:
        return None
    try:
        return [int(d) for d in shape]
    except TypeError:  # a symbolic dim
        return None


def count_int_matmuls(mod: Any) -> int:
    """How many int32-accumulating matmuls ``mod``'s Relax functions hold."""
    from tvm import relax

    count = 0

    def visit(expr: Any) -> None:
        nonlocal count
        if _op(expr) == "relax.matmul" and str(getattr(expr.ty, "dtype", "")) == "int32":
            count += 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return count


def rewrite_int8_matmuls(mod: Any) -> tuple[Any, dict[str, Any]]:
    """Rewrite every matching integer matmul of ``mod``'s Relax functions; report what happened."""
    import tvm
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    from targets.tvm_schedules import vnni_dense

    skipped: Counter[str] = Counter()
    rewritten = [0]
    kernels: dict[tuple[int, int, int], Any] = {}

    @expr_functor.mutator
    class _Mutator(PyExprMutator):  # type: ignore[misc]
        def _bound(self, expr: Any) -> Any:
            return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

        def _activation(self, lhs: Any) -> tuple[Any, Any] | str:
            """``(a_u8, za)`` from ``astype(a) - astype(za)`` or ``astype(a)``, else why not."""
            expr = self._bound(lhs)
            za: Any = None
            if _op(expr) == "relax.subtract":
                za_expr = self._bound(expr.args[1])
                if _op(za_expr) != "relax.astype" or _static_shape(za_expr.args[0]) != []:
                    return "activation zero point is not a scalar"
                za = za_expr.args[0]
                expr = self._bound(expr.args[0])
            if _op(expr) != "relax.astype":
                return "activation is not a widened integer tensor"
            a = expr.args[0]
            if str(a.ty.dtype) != "uint8" or (za is not None and str(za.ty.dtype) != "uint8"):
                return "activation is not uint8"
            return a, za

        def _weight(self, rhs: Any) -> np.ndarray | str:
            """The int8 weight as numpy when it is a constant with zero zero points, else why not."""
            expr = self._bound(rhs)
            if _op(expr) == "relax.subtract":
                zp = self._bound(expr.args[1])
                while _op(zp) in ("relax.astype", "relax.expand_dims"):
                    zp = self._bound(zp.args[0])
                if not isinstance(zp, tvm.ir.expr.Constant) or np.any(zp.value.numpy() != 0):
                    return "weight zero point is not a constant zero"
                expr = self._bound(expr.args[0])
            if _op(expr) != "relax.astype" or not isinstance(self._bound(expr.args[0]), tvm.ir.expr.Constant):
                return "weight is not a constant"
            w = self._bound(expr.args[0]).value.numpy()
            if w.dtype != np.int8 or w.ndim != 2:
                return "weight is not a 2-D int8 tensor"
            return w

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if _op(call) != "relax.matmul" or str(call.ty.dtype) != "int32":
                return call
            activation = self._activation(call.args[0])
            weight = self._weight(call.args[1])
            shape = _static_shape(call.args[0])
            why = activation if isinstance(activation, str) else weight if isinstance(weight, str) else ""
            if not why and shape is None:
                why = "activation shape is symbolic"
            if why:
                skipped[why] += 1
                return call
            assert not isinstance(activation, str) and not isinstance(weight, str) and shape is not None
            a, za = activation
            k, n = weight.shape
            m = int(np.prod(shape[:-1]))
            why = vnni_dense.supports(m, k, n)
            if why:
                skipped[why] += 1
                return call
            if (m, k, n) not in kernels:
                name = f"vnni_dense_{m}x{k}x{n}"
                func = vnni_dense.dense_u8s8(m, k, n).with_attr("global_symbol", name)
                kernels[(m, k, n)] = self.builder_.add_func(func, name)
            bb = self.builder_
            rewritten[0] += 1
            a2 = bb.emit(relax.op.reshape(a, [m, k])) if len(shape) != 2 else a
            za = za if za is not None else relax.const(np.uint8(0), "uint8")
            colsum = weight.astype(np.int32).sum(axis=0, dtype=np.int32)
            out = bb.emit(
                relax.call_tir(
                    kernels[(m, k, n)],
                    [a2, relax.const(vnni_dense.pack_weight(weight)), za, relax.const(colsum)],
                    relax.TensorType([m, n], "int32"),
                )
            )
            return relax.op.reshape(out, [*shape[:-1], n]) if len(shape) != 2 else out

    mutator = _Mutator(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    # The int32 widening of each rewritten weight is dead now; drop it before legalization.
    mod = relax.transform.DeadCodeElimination()(mutator.builder_.get())
    return mod, {"rewritten": rewritten[0], "kernels": len(kernels), "skipped": dict(skipped)}
