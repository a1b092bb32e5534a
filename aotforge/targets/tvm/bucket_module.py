"""One Relax module from the per-bucket imports: every bucket's ``main`` under its own name.

The Relax ONNX importer emits helper PrimFuncs (e.g. ``maximum`` for a clamp) next to ``main``,
shape-specific and with the same name in every bucket; each is added through a ``BlockBuilder``,
which gives a clashing name a fresh one and reuses a structurally equal function, and each
bucket's ``main`` is rewritten to call its own. The weights are not duplicated: the VM's constant
pool stores equal constants once, so a bucket adds only its code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def merge_buckets(imports: Sequence[tuple[str, Any]]) -> Any:
    """``[(function name, imported IRModule)]`` -> one IRModule with each ``main`` renamed."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rebind(relax.PyExprMutator):  # type: ignore[misc]
        def __init__(self, mapping: dict[str, Any]) -> None:
            super().__init__()
            self.mapping = mapping

        def visit_global_var_(self, op: Any) -> Any:
            return self.mapping.get(op.name_hint, op)

    builder = relax.BlockBuilder(tvm.IRModule())
    for name, mod in imports:
        mapping = {
            gv.name_hint: builder.add_func(func, gv.name_hint)
            for gv, func in mod.functions_items()
            if gv.name_hint != "main"
        }
        main = _Rebind(mapping).visit_expr(mod["main"]) if mapping else mod["main"]
        builder.add_func(main.with_attr("global_symbol", name), name)
    return builder.get()
