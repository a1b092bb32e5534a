"""A decode / verify step's attention over the whole static cache -> ``kernels/decode_attention`` over its filled part.

The decode graph (``compiler.generative.graphs.Decode``) attends over all ``max_seq_len`` positions
of the cache with a mask that allows ``position <= write_pos`` of each slot; the verify graph
(``graphs.Verify``) writes its ``w`` tokens at ``write_pos + 0 .. w-1`` and lets query ``i`` see
``position <= write_pos + i``. The exporter spells either
``softmax(q * c1 @ (K^T * c2) + mask) @ V`` with K and V reached from the in-place cache update
(``rewrites/kv_inplace``) through the head expansion of grouped-query attention (expand /
broadcast / reshape / transpose). That is matched from the final matmul back to the two caches and
replaced by one kernel that reads ``write_pos + 1`` positions of each slot, with each query head
reading its KV head as stored (a verify step's query ``i``: ``write_pos + i + 1``). The mask is not
read: only these graphs' masks, which the kernel's bound computes, make the rewrite exact, so it runs
on generative decode / verify functions only, and declines a mask that is not ``where(position <= bound,
...)`` alone (a sliding window's band, ``and``-ed to it: that layer keeps its masked attention). Which one a
match is, and ``write_pos``, come from the cache update's index: ``write_pos`` itself (decode), or
``write_pos + [0 .. w-1]`` (verify).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.kernels import decode_attention as kernel
from aotforge.targets.tvm.relax_util import constant_value, op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule, apply_rules

#: Ops that only move or repeat a tensor's elements (the GQA head expansion, K's transpose).
_VIEWS = ("relax.reshape", "relax.permute_dims", "relax.broadcast_to", "relax.expand_dims")


@dataclasses.dataclass(frozen=True)
class Attention:
    q: Any
    keys: Any
    values: Any
    pos: Any
    scale: float
    width: int


def _trace(expr: Any, bound: Callable[[Any], Any], until: str) -> Any:
    """The var bound to an ``until`` call that ``expr`` is a view of (``None`` if it is not one)."""
    from tvm import relax

    while True:
        value = bound(expr) if isinstance(expr, relax.Var) else expr
        if value is None:
            return expr if until == "" else None
        if op_name(value) == until:
            return expr
        if op_name(value) not in _VIEWS:
            return None
        expr = value.args[0]


def _write_position(index: Any, bound: Callable[[Any], Any]) -> tuple[Any, int] | None:
    """``(write_pos, w)`` for a cache index that is a view of ``write_pos`` (w = 1) or of
    ``write_pos[:, None] + [0 .. w-1]`` (the verify graph's positions); ``None`` for anything else."""
    import numpy as np

    pos = _trace(index, bound, "")
    if pos is not None:
        return pos, 1
    added = _trace(index, bound, "relax.add")
    if added is None:
        return None
    add, shape = bound(added), static_shape(added)
    for base, offsets in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        steps, pos = constant_value(offsets), _trace(base, bound, "")
        if steps is None or pos is None or shape is None or len(shape) != 2:
            continue
        # [w] or [1, w] counting 0 .. w-1 along the sum's last axis: query i is written at write_pos + i
        if steps.shape[-1] == steps.size == shape[1] and np.array_equal(steps.reshape(-1), np.arange(steps.size)):
            return pos, steps.size
    return None


def _filled_prefix(mask: Any, bound: Callable[[Any], Any]) -> bool:
    """Whether ``mask`` is a view of ``where(c, 0, min)`` with ``c`` a view of one ``<=`` comparison: the mask the
    kernel's bound replaces. A sliding window's mask ands a second comparison to it."""
    where = _trace(mask, bound, "relax.where")
    if where is None:
        return False
    condition = bound(where).args[0]
    return any(_trace(condition, bound, op) is not None for op in ("relax.less_equal", "relax.greater_equal"))


def _scaled(expr: Any, bound: Callable[[Any], Any]) -> tuple[Any, float]:
    """``(x, c)`` for ``multiply(x, constant c)``, else ``(expr, 1.0)``."""
    value = bound(expr)
    if op_name(value) == "relax.multiply":
        for x, c in ((value.args[0], value.args[1]), (value.args[1], value.args[0])):
            number = constant_value(c)
            if number is not None and number.size == 1:
                return x, float(number.reshape(()))
    return expr, 1.0


class DecodeAttention(Rule):
    name = "decode_attention"

    def __init__(self) -> None:
        self.verify = 0  # how many of the rewritten attentions are a verify step's (width > 1)

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.matmul" and op_name(bound(call.args[0])) == "relax.nn.softmax"

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        bound = rw.bound
        total = bound(bound(call.args[0]).args[0])
        if op_name(total) != "relax.add":
            return MatchResult.fail("softmax of something else than scores + mask")
        for side in (0, 1):
            raw, after = _scaled(total.args[side], bound)
            if op_name(bound(raw)) == "relax.matmul":
                break
        else:
            return MatchResult.fail("no q @ K^T under the softmax")
        q, c1 = _scaled(bound(raw).args[0], bound)
        kt, c2 = _scaled(bound(raw).args[1], bound)
        keys = _trace(kt, bound, "relax.call_tir_inplace")
        values = _trace(call.args[1], bound, "relax.call_tir_inplace")
        if keys is None or values is None:
            return MatchResult.fail("K or V is not a view of the in-place cache")
        written = _write_position(bound(keys).args[1].fields[1], bound)
        if written is None:
            return MatchResult.fail("the cache index is neither write_pos nor write_pos + 0..w-1 of an input")
        if not _filled_prefix(total.args[1 - side], bound):  # a decode / verify step's: is it the kernel's bound?
            return MatchResult.fail("the mask is not position <= write_pos alone (a sliding window's band?)")
        pos, width = written
        return self._shapes(Attention(q, keys, values, pos, c1 * c2 * after, width))

    def _shapes(self, att: Attention) -> MatchResult[Any]:
        q, cache, pos = static_shape(att.q), static_shape(att.keys), static_shape(att.pos)
        if q is None or cache is None or len(q) != 4 or len(cache) != 4 or q[2] != att.width or pos != q[:1]:
            return MatchResult.fail(
                "not one query per written position of a slot over a [batch, kv_heads, seq, dim] cache"
            )
        if q[1] % cache[1] or q[3] != cache[3] or static_shape(att.values) != cache:
            return MatchResult.fail("query heads do not group over the cache's heads")
        why = kernel.supports(q[3])
        return MatchResult.fail(why) if why else MatchResult((att, (*q[:2], cache[1], cache[2], q[3])))

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        att, (b, h, kv, s, d) = value
        w = att.width
        self.verify += w > 1
        shape = f"{b}x{h}x{kv}x{s}x{d}" + (f"_w{w}" if w > 1 else "")
        name = f"decode_attention_{shape}_{att.scale:.6g}".replace(".", "p").replace("-", "m")
        prim = rw.add_kernel(
            name,
            lambda: kernel.decode_attention(b, h, kv, s, d, att.scale, w).with_attr(
                kernel.ATTENTION_ATTR, [float(att.scale), w]
            ),
        )
        return relax.call_tir(prim, [att.q, att.keys, att.values, att.pos], call.ty)


def attention_over_filled_cache(mod: Any) -> tuple[Any, dict[str, Any]]:
    """``mod`` with each matched decode / verify attention on the kernel; what was and was not
    (``rewritten``: the decode steps', ``verify_rewritten``: the verify steps')."""
    rule = DecodeAttention()
    mod, stats = apply_rules(mod, [rule])
    decode = sum(stats.applied.values()) - rule.verify
    return mod, {"rewritten": decode, "verify_rewritten": rule.verify, "skipped": dict(stats.skipped)}
