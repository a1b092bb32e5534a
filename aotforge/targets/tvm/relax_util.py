"""Small helpers the tvm target's Relax rewrites share (one walk, one way to name an op)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def op_name(expr: Any) -> str:
    """``"relax.matmul"`` for a call of that op; ``""`` for anything else."""
    from tvm import relax

    return str(expr.op.name) if isinstance(expr, relax.Call) and hasattr(expr.op, "name") else ""


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
