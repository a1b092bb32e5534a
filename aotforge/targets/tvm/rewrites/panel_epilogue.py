"""``add(panel_matmul(x, w), y)`` over a prompt's rows -> one panel kernel that adds ``y`` as each tile leaves its
registers (``kernels/panel_matmul``, ``add=True``).

The panel kernel is a hand-scheduled PrimFunc, opaque to Relax's FuseOps, so a residual added to a projection's
output (a decoder layer's attention output and its MLP's down projection) was a kernel of its own: one more
parallel launch per add, reading the product and the residual back from memory. On a loaded machine each launch's
fork / join can wait out a descheduled worker's time slice, so on a prompt pass these small kernels cost far more
than their bytes (a SmolLM-135M-shaped prompt of 128, 60 such adds: ~65 ms of the profile's ~580 ms inside calls).

The rule is over the graph, not a model: an ``add`` whose one operand is the panel kernel's whole output
(through a reshape, nothing else reading either) and whose other operand has the add's own shape (no
broadcast), at a row count the kernel tiles by 8 (a prompt; a decode step's few rows keep their own kernel).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from tvm import relax

from aotforge.targets.tvm.kernels import panel_matmul as kernel
from aotforge.targets.tvm.relax_util import dtype_of, op_name, relax_functions, static_shape

_PREFIX = "panel_matmul_"


def residuals_into_panels(mod: Any) -> tuple[Any, int]:
    """``mod`` with each such add on the panel kernel's adding variant; how many were taken. The calls left
    unused are the caller's to drop (``DeadCodeElimination``)."""
    mutator = _Residuals(mod)
    for gv, func in relax_functions(mod):
        mutator.uses = _uses(func)
        mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get(), mutator.taken


@relax.expr_functor.mutator
class _Residuals(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any) -> None:
        super().__init__(mod)
        self.mod = mod
        self.uses: Counter[Any] = Counter()
        self.kernels: dict[str, Any] = {}
        self.taken = 0

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if op_name(call) != "relax.add":
            return call
        a, b = call.args
        for product, y in ((a, b), (b, a)):
            fused = self.fused(product, y)
            if fused is not None:
                return fused
        return call

    def fused(self, product: Any, y: Any) -> Any:
        """``product + y`` as one adding panel call, or ``None`` when the rule does not hold."""
        shape = static_shape(product)
        if shape is None or static_shape(y) != shape or {dtype_of(product), dtype_of(y)} != {"float32"}:
            return None
        inner = self.single_use_value(product)
        if op_name(inner) == "relax.reshape":
            inner = self.single_use_value(inner.args[0])
        if op_name(inner) != "relax.call_tir" or not isinstance(inner.args[0], relax.GlobalVar):
            return None
        x, w = inner.args[1].fields if len(inner.args[1].fields) == 2 else (None, None)
        x_shape, out_shape = static_shape(x) if x is not None else None, static_shape(inner)
        if x_shape is None or out_shape is None or w is None:
            return None
        (rows, k), n = x_shape, out_shape[1]
        if inner.args[0].name_hint != f"{_PREFIX}{rows}x{k}x{n}" or rows <= kernel.TILE_M:
            return None
        if out_shape != [rows, n] or int(np.prod(shape)) != rows * n:
            return None
        name = f"{_PREFIX}add_{rows}x{k}x{n}"
        if name not in self.kernels:
            func = kernel.panel_matmul(rows, k, n, add=True).with_attr("global_symbol", name)
            self.kernels[name] = self.builder_.add_func(func, name)
        flat = self.builder_.emit(relax.op.reshape(y, (rows, n)))
        out = self.builder_.emit(
            relax.call_tir(self.kernels[name], [x, w, flat], relax.TensorType((rows, n), "float32"))
        )
        self.taken += 1
        return relax.op.reshape(out, shape)

    def single_use_value(self, expr: Any) -> Any:
        """The value bound to ``expr`` when it is a variable read only once; ``None`` otherwise."""
        if not isinstance(expr, relax.Var) or self.uses[expr] != 1:
            return None
        return self.lookup_binding(expr)


def _uses(func: Any) -> Counter[Any]:
    """How many times each variable of ``func`` is read."""
    uses: Counter[Any] = Counter()

    def visit(e: Any) -> None:
        if isinstance(e, relax.Var):
            uses[e] += 1

    relax.analysis.post_order_visit(func.body, visit)
    return uses
