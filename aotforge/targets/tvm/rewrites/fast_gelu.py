"""Fast GELU for the ``tvm`` target's fast-math stage: TVM's ``FastMathTransform`` misses GELU."""

from __future__ import annotations

import math
from typing import Any

from aotforge.targets.tvm.relax_util import op_name, rewrite_functions


def fast_gelu_pass() -> Any:
    """``relax.nn.gelu`` -> ``0.5 x (1 + fast_erf(x / sqrt 2))`` (FastMathTransform misses GELU)."""
    import tvm
    from tvm import topi
    from tvm.relax import PyExprMutator, expr_functor

    def gelu(x: Any) -> Any:
        half = tvm.tirx.const(0.5, x.dtype)
        scaled = topi.multiply(x, tvm.tirx.const(1.0 / math.sqrt(2.0), x.dtype))
        return topi.multiply(topi.multiply(x, half), topi.add(topi.fast_erf(scaled), tvm.tirx.const(1.0, x.dtype)))

    @expr_functor.mutator
    class _Mutator(PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if op_name(call) == "relax.nn.gelu" and str(getattr(call.args[0].ty, "dtype", "")) == "float32":
                return self.builder_.call_te(gelu, call.args[0], primfunc_name_hint="fast_gelu")
            return call

    @tvm.transform.module_pass(opt_level=0, name="FastGelu")
    def _pass(mod: Any, _ctx: Any) -> Any:
        return rewrite_functions(_Mutator, mod)

    return _pass
