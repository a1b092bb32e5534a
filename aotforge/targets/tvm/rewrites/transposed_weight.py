"""``matmul(x, permute_dims(w))`` with ``w`` a function argument and few rows -> the ``gemv_nt`` kernel.

A decoder's head is ``Gemm(transB=1)`` against the ``[vocab, hidden]`` embedding. With the weights
as arguments (a generative build) the transpose cannot be folded at compile time: the generic
path would transpose the whole embedding every token, then read it a column per lane.
``kernels/gemv_nt`` reads it as stored instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.kernels import gemv_nt
from aotforge.targets.tvm.relax_util import op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule, apply_rules


class TransposedArgument(Rule):
    name = "matmul_transposed_weight"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.matmul" and op_name(bound(call.args[1])) == "relax.permute_dims"

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        from tvm import relax

        x, transposed = call.args[0], rw.bound(call.args[1])
        weight = transposed.args[0]
        if not isinstance(weight, relax.Var) or rw.bound(weight) is not None:
            return MatchResult.fail("the transposed weight is not a function argument")
        shape, w_shape = static_shape(x), static_shape(weight)
        if shape is None or w_shape is None or len(w_shape) != 2 or shape[-1] != w_shape[1]:
            return MatchResult.fail("not a static [.., K] x [N, K]^T matmul")
        if str(x.ty.dtype) != "float32" or str(weight.ty.dtype) != "float32":
            return MatchResult.fail("not float32")
        rows = 1
        for d in shape[:-1]:
            rows *= d
        why = gemv_nt.supports(rows, w_shape[1], w_shape[0])
        return MatchResult.fail(why) if why else MatchResult((shape, rows, w_shape, weight))

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        shape, rows, (n, k), weight = value
        kernel = rw.add_kernel(f"gemv_nt_{rows}x{k}x{n}", lambda: gemv_nt.gemv_nt(rows, k, n))
        flat = rw.builder_.emit(relax.op.reshape(call.args[0], (rows, k)))
        out = rw.builder_.emit(relax.call_tir(kernel, [flat, weight], relax.TensorType((rows, n), "float32")))
        return relax.op.reshape(out, (*shape[:-1], n))


def transposed_weights(mod: Any) -> tuple[Any, dict[str, Any]]:
    """``mod`` with every matching matmul on the kernel; what was and was not."""
    mod, stats = apply_rules(mod, [TransposedArgument()])
    return mod, {"rewritten": sum(stats.applied.values()), "skipped": dict(stats.skipped)}
