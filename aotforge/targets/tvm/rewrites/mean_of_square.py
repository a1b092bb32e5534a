"""``mean(x * x)`` (an RMSNorm's, ``power(x, 2)`` or ``multiply(x, x)``) -> one PrimFunc that squares and averages.

Relax legalizes ``mean`` as a sum and a division in one PrimFunc, which FuseOps classes as a kernel that fuses what
follows it but not what comes before: an RMSNorm's square stayed a kernel of its own ahead of every norm, one more
launch and a ``[rows, hidden]`` round trip through memory (61 per SmolLM-135M-shaped decode step and prompt pass).
Rewritten as a ``call_te`` of square, sum and division, FuseOps still fuses what follows (the epsilon, the root, the
scaling), so the norm is one kernel. The division is Relax's own legalization of ``mean`` (``topi.sum``, then
``topi.divide`` by the count), and ``x * x`` is what LLVM makes of ``pow(x, 2)``: only the order in which the
schedule sums the squares can differ (last-bit). Only a mean over a square's last axis is rewritten; others keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.relax_util import dtype_of, op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import Rewriter, Rule, apply_rules

_SQUARES = ("relax.power", "relax.multiply")


def _mean_of_square(x: Any, keepdims: bool) -> Any:
    """``mean(x * x)`` over the last axis as Relax legalizes a mean (``topi.sum``, then ``topi.divide`` by the
    count), the square read inside the sum: no ``[rows, hidden]`` buffer of squares between them."""
    from tvm import te, topi

    *rows, n = (int(d) for d in x.shape)
    r = te.reduce_axis((0, n), name="r")

    def total(*i: Any) -> Any:
        at = (*i[: len(rows)], r)
        return te.sum(x[at] * x[at], axis=r)

    return topi.divide(te.compute((*rows, 1) if keepdims else tuple(rows), total, name="sum_of_squares"), n)


class MeanOfSquare(Rule):
    name = "mean_of_square"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        if op_name(call) != "relax.mean" or dtype_of(call) != "float32" or not static_shape(call.args[0]):
            return False
        rank = len(static_shape(call.args[0]) or [])
        axes = [int(a) % rank for a in call.attrs.axis] if call.attrs.axis is not None else list(range(rank))
        return axes == [rank - 1] and _squared(bound(call.args[0])) is not None  # a norm's: over the last axis

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        x = _squared(rw.bound(call.args[0]))
        return rw.builder_.call_te(_mean_of_square, x, bool(call.attrs.keepdims), primfunc_name_hint="mean_of_square")


def _squared(value: Any) -> Any:
    """``x`` of ``power(x, 2.0)`` or ``multiply(x, x)``; ``None`` for anything else."""
    from aotforge.targets.tvm.relax_util import constant_value

    if op_name(value) == "relax.multiply" and value.args[0].same_as(value.args[1]):
        return value.args[0]
    if op_name(value) == "relax.power":
        exponent = constant_value(value.args[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0:
            return value.args[0]
    return None


def norm_squares_fused(mod: Any) -> tuple[Any, int]:
    """``mod`` with each mean of a square as a sum over the count; how many were rewritten."""
    mod, stats = apply_rules(mod, [MeanOfSquare()])
    return mod, stats.applied[MeanOfSquare.name]
