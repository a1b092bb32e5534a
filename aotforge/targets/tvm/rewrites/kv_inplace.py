# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""The decode graph's KV-cache update, done in the caller's buffer: ``scatter_elements`` -> in place.

The decode graph writes each slot's new keys / values with ``ScatterElements(past, index,
new)`` on the sequence axis, which the Relax importer turns into ``relax.scatter_elements``: a
fresh cache-sized tensor, the whole cache copied into it, every layer, every token. Where the
scattered tensor is an argument of the function (the ``past_*`` cache the runtime passes), the
call becomes ``call_tir_inplace`` of a kernel that writes the ``[batch, heads, 1, dim]`` new
values (a verify graph's ``[batch, heads, w, dim]``) into the argument itself: the result *is* the
argument, so the cache is never copied or reallocated. The index is clamped to the cache, so a bad
position never writes outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.relax_util import op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule, apply_rules


def scatter_kernel(shape: list[int], dtype: str, steps: int = 1) -> Any:
    """``cache[b, h, index[b, h, t, d], d] = update[b, h, t, d]``, in place (a scheduled PrimFunc); ``t`` < ``steps``
    (1 for decode, the verify graph's width for it)."""
    from tvm.script import tirx as T

    b, h, s, d = (T.int64(n) for n in shape)
    one = T.int64(1)
    w = T.int64(steps)

    @T.prim_func(private=True, s_tir=True)
    def kernel(
        cache: T.Buffer((b, h, s, d), dtype),
        index: T.Buffer((b, h, w, d), "int64"),
        update: T.Buffer((b, h, w, d), dtype),
    ) -> None:
        # op_pattern 8 (opaque): FuseOps leaves the call alone, as the in-place write must be.
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})
        for i, j, t, k in T.grid(b, h, w, d):
            cache[i, j, T.min(T.max(index[i, j, t, k], T.int64(0)), s - one), k] = update[i, j, t, k]

    return kernel


class ScatterIntoArgument(Rule):
    """``scatter_elements(arg, index, new, axis=2)`` of a 4-D function argument -> in place."""

    name = "kv_cache_scatter"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.scatter_elements"

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        from tvm import relax

        data, index, update = call.args
        if not isinstance(data, relax.Var) or rw.bound(data) is not None:
            return MatchResult.fail("the scattered tensor is not a function argument")
        shape, upd = static_shape(data), static_shape(update)
        if (
            shape is None
            or upd is None
            or len(shape) != 4
            or int(call.attrs.axis) % 4 != 2
            or upd != [*shape[:2], upd[2], shape[3]]
            or not 1 <= upd[2] <= shape[2]
        ):
            return MatchResult.fail("not a few positions per slot on axis 2 of a static 4-D cache")
        if str(call.attrs.reduction) != "update" or str(index.ty.dtype) != "int64":
            return MatchResult.fail("not a plain int64-indexed update")
        return MatchResult((shape, upd[2]))

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        dtype = str(call.args[0].ty.dtype)
        shape, steps = value
        name = "kv_scatter_" + "x".join(map(str, shape)) + ("" if steps == 1 else f"_w{steps}") + "_" + dtype
        kernel = rw.add_kernel(name, lambda: scatter_kernel(shape, dtype, steps))
        return relax.call_tir_inplace(kernel, list(call.args), [0], call.args[0].ty)


def kv_cache_in_place(mod: Any) -> tuple[Any, dict[str, Any]]:
    """``mod`` with every cache scatter into an argument done in place; what was and was not."""
    mod, stats = apply_rules(mod, [ScatterIntoArgument()])
    return mod, {"in_place": sum(stats.applied.values()), "skipped": dict(stats.skipped)}
