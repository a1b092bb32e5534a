"""bf16 rule: matmuls accumulate in fp32.

``matmul(a, b)`` on bf16 becomes ``astype(matmul(a, b, out_dtype=float32), bf16)``. TIR
accumulates a reduction in its output dtype; that is fp32 only where a schedule gives the sum a
local tile (which BF16 legalization widens). A reduction scheduled in place (K=1 of attention at
seq 1, taken by the injective rule) read-modify-writes the bf16 output, which TVM's BF16 storage
legalization cannot lower ("dtype mismatch on BufferStore ... uint16 ... bfloat16x16"), and which
would round the sum at every step. Stated in the graph, fp32 accumulation holds whatever
schedule runs; the cast fuses into the matmul's epilogue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.relax_util import BF16, dtype_of, op_name
from aotforge.targets.tvm.rewrites.rule import Rewriter, Rule


class MatmulAccumulatesInFp32(Rule):
    name = "matmuls_fp32_accumulate"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.matmul" and dtype_of(call) == BF16

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        wide = rw.builder_.emit(relax.op.matmul(call.args[0], call.args[1], out_dtype="float32"))
        return relax.op.astype(wide, BF16)
