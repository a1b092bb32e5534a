"""bf16 rule: NaN / Inf tests read an fp32 copy.

TIR's ``isnan`` / ``isinf`` / ``isfinite`` know only fp16/32/64: legalizing one on bf16 fails
the build ("Data type T.bfloat16 not supported for isnan op"). A bf16 graph meets them without
asking: the ONNX importer guards ``Clip(x, min, max)`` bounds with ``where(isnan(min), -inf,
min)``, and the bf16 pass makes those bounds bf16 (MiniLM's ``clamp(min=1e-9)`` in mean
pooling). Keeping ``Clip`` fp32 in the bf16 pass instead would move the clamp and its
neighbours off bf16 behind Casts for a lowering detail; bf16 -> fp32 is exact (every NaN and Inf
maps to itself), and on a constant bound the legalize stage's ``FoldConstant`` removes the copy
with the test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.relax_util import BF16, dtype_of, op_name
from aotforge.targets.tvm.rewrites.rule import Rewriter, Rule

_CHECKS = frozenset({"relax.isnan", "relax.isinf", "relax.isfinite"})


class ChecksInFp32(Rule):
    name = "checks_in_fp32"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) in _CHECKS and dtype_of(call.args[0]) == BF16

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        wide = rw.builder_.emit(relax.op.astype(call.args[0], "float32"))
        return relax.Call(call.op, [wide], call.attrs)
