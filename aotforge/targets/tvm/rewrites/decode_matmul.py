"""``matmul(x, w)`` with ``w`` a ``[K, N]`` function argument and few rows -> the ``gemv_kn`` kernel.

A decode step's projections (and a short verify step's) multiply a few rows by weights the
generative build passes as arguments. The tiled matmul schedule reads such a weight in 48-column
panels, a short run of every row: ~20 GB/s, and no cheaper at 1 row than at 4.
``kernels/gemv_kn`` streams it row by row, once for all rows. The epilogue the fusion would have
put into the matmul (bias, residual add, SwiGLU's gate) becomes an elementwise kernel of its own
over the few rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.kernels import gemv_kn
from aotforge.targets.tvm.relax_util import op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule, apply_rules


class WeightArgument(Rule):
    name = "matmul_weight_argument"

    def __init__(self, cores: int) -> None:
        self.cores = cores

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        from tvm import relax

        return op_name(call) == "relax.matmul" and isinstance(call.args[1], relax.Var) and bound(call.args[1]) is None

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        x, weight = call.args
        shape, w_shape = static_shape(x), static_shape(weight)
        if shape is None or w_shape is None or len(w_shape) != 2 or len(shape) < 2 or shape[-1] != w_shape[0]:
            return MatchResult.fail("not a static [.., K] x [K, N] matmul")
        if str(x.ty.dtype) != "float32" or str(weight.ty.dtype) != "float32":
            return MatchResult.fail("not float32")
        rows = 1
        for d in shape[:-1]:
            rows *= d
        why = gemv_kn.supports(rows, w_shape[0], w_shape[1])
        return MatchResult.fail(why) if why else MatchResult((shape, rows, w_shape))

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        shape, rows, (k, n) = value
        kernel = rw.add_kernel(f"gemv_kn_{rows}x{k}x{n}", lambda: gemv_kn.gemv_kn(rows, k, n, self.cores))
        flat = rw.builder_.emit(relax.op.reshape(call.args[0], (rows, k)))
        out = rw.builder_.emit(relax.call_tir(kernel, [flat, call.args[1]], relax.TensorType((rows, n), "float32")))
        return relax.op.reshape(out, (*shape[:-1], n))


def decode_matmuls(mod: Any, cores: int) -> tuple[Any, dict[str, Any]]:
    """``mod`` with every matching matmul on the kernel (K split over ``cores``); what was and was not."""
    mod, stats = apply_rules(mod, [WeightArgument(cores)])
    return mod, {"rewritten": sum(stats.applied.values()), "skipped": dict(stats.skipped)}
