"""Small helpers the tvm target's Relax rewrites share (one walk, one way to name an op)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

BF16 = "bfloat16"


def op_name(expr: Any) -> str:
    """``"relax.matmul"`` for a call of that op; ``""`` for anything else."""
    from tvm import relax

    return str(expr.op.name) if isinstance(expr, relax.Call) and hasattr(expr.op, "name") else ""


def dtype_of(expr: Any) -> str:
    """The element type of a tensor-typed expression (``"bfloat16"``); ``""`` for anything else."""
    return str(getattr(expr.ty, "dtype", ""))


def relax_functions(mod: Any) -> list[tuple[Any, Any]]:
    """``(global var, function)`` for every Relax function of ``mod`` (PrimFuncs left out)."""
    from tvm import relax

    return [(gv, func) for gv, func in mod.functions_items() if isinstance(func, relax.Function)]


def rewrite_functions(mutator_type: Callable[[Any], Any], mod: Any) -> Any:
    """``mod`` with every Relax function run through a ``PyExprMutator`` of ``mutator_type``."""
    mutator = mutator_type(mod)
    for gv, func in relax_functions(mod):
        mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def any_call(mod: Any, matches: Callable[[Any], bool]) -> bool:
    """Whether some expression of ``mod``'s Relax functions ``matches``."""
    from tvm import relax

    found = False

    def visit(expr: Any) -> None:
        nonlocal found
        found = found or matches(expr)

    for _, func in relax_functions(mod):
        relax.analysis.post_order_visit(func, visit)
    return found


def static_shape(expr: Any) -> list[int] | None:
    """The dims of a tensor-typed expression; ``None`` when it has a symbolic dim or no shape."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None:
        return None
    try:
        return [int(d) for d in shape]
    except TypeError:  # a symbolic dim
        return None


def constant_value(expr: Any) -> np.ndarray | None:
    """A Relax constant's value as numpy; ``None`` for anything that is not a constant."""
    import tvm

    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None


def var_uses(func: Any) -> Counter[Any]:
    """How many times each variable of the Relax function ``func`` is read."""
    from tvm import relax

    uses: Counter[Any] = Counter()

    def visit(e: Any) -> None:
        if isinstance(e, relax.Var):
            uses[e] += 1

    relax.analysis.post_order_visit(func.body, visit)
    return uses
