"""Fast GELU and sigmoid for the ``tvm`` target's fast-math stage: TVM's ``FastMathTransform`` misses both.

``relax.nn.gelu`` on fp32 -> ``0.5 x (1 + fast_erf(x / sqrt 2))``: TVM's vectorized erf
polynomial (~5e-6 max abs error) instead of a scalar libm call per element.

``relax.sigmoid`` / ``relax.nn.silu`` on fp32 -> ``1 / (1 + exp(-x))`` (times ``x``) as Relax ops, whose ``exp``
``FastMathTransform`` (run next) turns into ``fast_exp``. The legalized sigmoid lowers to LLVM's ``exp`` intrinsic,
which has no vector form here: a scalar ``expf`` call per lane, which in the epilogue of a SwiGLU gate's matmul
cost more than the matmul itself. ``fast_exp`` clamps its argument to +-88.4, so the sigmoid saturates at 0 / 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.relax_util import dtype_of, op_name
from aotforge.targets.tvm.rewrites.rule import Rewriter, Rule, apply_rules


def _gelu_te(x: Any) -> Any:
    import tvm
    from tvm import topi

    half = tvm.tirx.const(0.5, x.dtype)
    scaled = topi.multiply(x, tvm.tirx.const(1.0 / math.sqrt(2.0), x.dtype))
    return topi.multiply(topi.multiply(x, half), topi.add(topi.fast_erf(scaled), tvm.tirx.const(1.0, x.dtype)))


class FastGelu(Rule):
    name = "fast_gelu"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.nn.gelu" and dtype_of(call.args[0]) == "float32"

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        return rw.builder_.call_te(_gelu_te, call.args[0], primfunc_name_hint="fast_gelu")


class FastSigmoid(Rule):
    name = "fast_sigmoid"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) in ("relax.sigmoid", "relax.nn.silu") and dtype_of(call.args[0]) == "float32"

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        x, one = call.args[0], relax.const(1.0, "float32")
        exp = rw.builder_.emit(relax.op.exp(relax.op.negative(x)))
        sigmoid = relax.op.divide(one, relax.op.add(one, exp))
        if op_name(call) == "relax.sigmoid":
            return sigmoid
        return relax.op.multiply(x, rw.builder_.emit(sigmoid))


def fast_gelu_pass() -> Any:
    """The rules as a module pass, to sit in a ``tvm.transform.Sequential`` before ``FastMathTransform``."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="FastGelu")
    def _pass(mod: Any, _ctx: Any) -> Any:
        return apply_rules(mod, [FastGelu(), FastSigmoid()])[0]

    return _pass
