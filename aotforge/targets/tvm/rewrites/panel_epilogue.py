"""``add(panel_matmul(x, w), y)`` -> one panel kernel that adds ``y`` as each tile leaves its registers
(``kernels/panel_matmul``, ``add=True``).

The panel kernel is a hand-scheduled PrimFunc, opaque to Relax's FuseOps, so a residual added to a projection's
output (a decoder layer's attention output and its MLP's down projection) was a kernel of its own: one more
launch per add, reading the product and the residual back from memory. Each parallel launch's fork / join can
wait out a descheduled worker's time slice, so on a prompt pass these small kernels cost far more than their bytes;
a decode step's are small serial kernels, each a VM call and an allocation.

The rule is over the graph, not a model: an ``add`` whose one operand is the panel kernel's whole output
(through a reshape, nothing else reading either) and whose other operand has the add's own shape (no
broadcast), at any row count (a decode step's few rows add ``y`` after summing their runs of K).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from tvm import relax

from aotforge.targets.tvm.kernels import panel_matmul as kernel
from aotforge.targets.tvm.relax_util import dtype_of, op_name, relax_functions, static_shape, var_uses

_PREFIX = "panel_matmul_"


def residuals_into_panels(mod: Any, few: kernel.FewRows = kernel.FewRows.SPLIT) -> tuple[Any, int]:
    """``mod`` with each such add on the panel kernel's adding variant (a few rows tiled as ``few``); how many
    were taken. The calls left unused are the caller's to drop (``DeadCodeElimination``)."""
    mutator = _Residuals(mod, few)
    for gv, func in relax_functions(mod):
        mutator.uses = var_uses(func)
        mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get(), mutator.taken


def panel_dims(call: Any) -> tuple[int, int, int] | None:
    """``(rows, k, n)`` of a call of the plain panel kernel (``panel_matmul_<rows>x<k>x<n>(x, w)``, ``x``
    ``[rows, k]``, out ``[rows, n]``); ``None`` for any other expression, whatever its arity or ranks (an
    embedding lookup from a tied head's panels, ``panel_rows``, is a ``call_tir`` of two arguments too, over
    rank-1 ids)."""
    if op_name(call) != "relax.call_tir" or not isinstance(call.args[0], relax.GlobalVar):
        return None
    if not call.args[0].name_hint.startswith(_PREFIX) or len(call.args[1].fields) != 2:
        return None
    x_shape, out_shape = static_shape(call.args[1].fields[0]), static_shape(call)
    if x_shape is None or out_shape is None or len(x_shape) != 2 or len(out_shape) != 2:
        return None
    (rows, k), n = x_shape, out_shape[1]
    if call.args[0].name_hint != f"{_PREFIX}{rows}x{k}x{n}" or out_shape[0] != rows:
        return None
    return rows, k, n


@relax.expr_functor.mutator
class _Residuals(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any, few: kernel.FewRows) -> None:
        super().__init__(mod)
        self.mod = mod
        self.few = few
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
        dims = panel_dims(inner)
        if dims is None:
            return None
        rows, k, n = dims
        if int(np.prod(shape)) != rows * n:
            return None
        x, w = inner.args[1].fields
        name = f"{_PREFIX}add_{rows}x{k}x{n}"
        if name not in self.kernels:
            func = kernel.panel_matmul(rows, k, n, few=self.few, add=True).with_attr("global_symbol", name)
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
