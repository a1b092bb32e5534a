"""Relax pass: what TVM's CPU lowering needs from a bf16 graph (tvm target).

Three rewrites, each where TVM's TIR falls short on bfloat16, not the graph:

- **NaN / Inf tests read an fp32 copy.** TIR's ``isnan`` / ``isinf`` / ``isfinite`` know only
  fp16/32/64: legalizing one on bf16 fails the build ("Data type T.bfloat16 not supported for
  isnan op"). A bf16 graph meets them without asking: the ONNX importer guards
  ``Clip(x, min, max)`` bounds with ``where(isnan(min), -inf, min)``, and the bf16 pass makes
  those bounds bf16 (MiniLM's ``clamp(min=1e-9)`` in mean pooling). Keeping ``Clip`` fp32 in the
  bf16 pass instead would move the clamp and its neighbours off bf16 behind Casts for a
  lowering detail; bf16 -> fp32 is exact (every NaN and Inf maps to itself), and on a constant
  bound the legalize stage's ``FoldConstant`` removes the copy with the test.
- **matmuls accumulate in fp32**: ``matmul(a, b)`` on bf16 becomes
  ``astype(matmul(a, b, out_dtype=float32), bf16)``. TIR accumulates a reduction in its output
  dtype; that is fp32 only where a schedule gives the sum a local tile (which BF16 legalization
  widens). A reduction scheduled in place (K=1 of attention at seq 1, taken by the injective
  rule) read-modify-writes the bf16 output, which TVM's BF16 storage legalization cannot lower
  ("dtype mismatch on BufferStore ... uint16 ... bfloat16x16"), and which would round the sum at
  every step. Stated in the graph, fp32 accumulation holds whatever schedule runs; the cast
  fuses into the matmul's epilogue.
- **transcendentals run on fp32** (GELU, erf, exp, tanh, sigmoid, softmax): TVM's fast-math
  versions (vectorized polynomials) are fp32-only, so on bf16 each element called scalar libm
  ``erff``: MiniLM's FFN-up + GELU kernel took 3.2 ms vs 0.39 ms in fp32 (8x), two thirds of
  the bf16 model. Runs before fast math so that it sees the fp32 ops; the casts fuse into the
  neighbouring kernels, and one rounding at the end is as accurate as bf16 gets.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from aotforge.targets.tvm.relax_util import op_name, rewrite_functions

_CHECKS = frozenset({"relax.isnan", "relax.isinf", "relax.isfinite"})
_TRANSCENDENTAL = frozenset(
    {"relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.softmax", "relax.erf", "relax.exp", "relax.tanh"}
    | {"relax.sigmoid"}
)
BF16 = "bfloat16"


def _dtype(expr: Any) -> str:
    return str(getattr(expr.ty, "dtype", ""))


def rewrite_bf16(mod: Any) -> tuple[Any, dict[str, int] | None]:
    """``mod`` with the three rewrites applied; the counts, or ``None`` (nothing to report) for non-bf16 graphs."""
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    counts: Counter[str] = Counter()

    @expr_functor.mutator
    class _Mutator(PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            op = op_name(call)
            if op in _CHECKS and _dtype(call.args[0]) == BF16:
                counts["checks_in_fp32"] += 1
                wide = self.builder_.emit(relax.op.astype(call.args[0], "float32"))
                return relax.Call(call.op, [wide], call.attrs)
            if op == "relax.matmul" and _dtype(call) == BF16:
                counts["matmuls_fp32_accumulate"] += 1
                wide = self.builder_.emit(relax.op.matmul(call.args[0], call.args[1], out_dtype="float32"))
                return relax.op.astype(wide, BF16)
            if op in _TRANSCENDENTAL and _dtype(call) == BF16:
                counts["transcendentals_in_fp32"] += 1
                wide = self.builder_.emit(relax.op.astype(call.args[0], "float32"))
                return relax.op.astype(self.builder_.emit(relax.Call(call.op, [wide], call.attrs)), BF16)
            return call

    rewritten = rewrite_functions(_Mutator, mod)
    if not counts:
        return mod, None
    return rewritten, dict(sorted(counts.items()))
