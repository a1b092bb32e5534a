"""Relax pass: bf16 NaN / Inf tests computed on float32 (tvm target).

TVM's TIR ``isnan`` / ``isinf`` / ``isfinite`` know only fp16/32/64: legalizing one on a
bfloat16 tensor fails the build ("Data type T.bfloat16 not supported for isnan op"). A bf16
graph meets them without asking: the ONNX importer turns ``Clip(x, min, max)`` into
``where(isnan(min), -inf, min)`` guards on the bounds, and the bf16 pass makes those bounds
bf16 (MiniLM's ``clamp(min=1e-9)`` in mean pooling).

Why here and not in the bf16 pass: the graph is right, the gap is TVM's intrinsic, and only
the test (a bool) is affected. Keeping ``Clip`` fp32 for tvm would move the clamp itself and
its neighbours off bf16 behind two Casts for a lowering detail; here the one bf16 -> fp32
``astype`` in front of the test is exact (bf16 is truncated fp32: every NaN and Inf maps
to itself) and, on a constant bound, the legalize stage's ``FoldConstant`` removes it with the test.
"""

from __future__ import annotations

from typing import Any

_CHECKS = frozenset({"relax.isnan", "relax.isinf", "relax.isfinite"})


def widen_bf16_checks(mod: Any) -> tuple[Any, dict[str, int] | None]:
    """``mod`` with each bf16 NaN / Inf test reading an fp32 copy; ``None`` (nothing to report) if none."""
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    count = 0

    @expr_functor.mutator
    class _Mutator(PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: Any) -> Any:
            nonlocal count
            call = super().visit_call_(call)
            op = getattr(call.op, "name", "")
            if op in _CHECKS and str(getattr(call.args[0].ty, "dtype", "")) == "bfloat16":
                count += 1
                wide = self.builder_.emit(relax.op.astype(call.args[0], "float32"))
                return relax.Call(call.op, [wide], call.attrs)
            return call

    mutator = _Mutator(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    if not count:
        return mod, None
    return mutator.builder_.get(), {"bf16_checks_in_fp32": count}
