"""bf16 rule: transcendentals run on fp32 (GELU, erf, exp, tanh, sigmoid, softmax).

TVM's fast-math versions (vectorized polynomials) are fp32-only, so on bf16 each element called scalar libm
``erff``, which made the GELU kernels most of a bf16 model's time. Runs before fast math so that it sees the fp32
ops; the casts fuse into the neighbouring kernels, and one rounding at the end is as accurate as bf16 gets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.relax_util import BF16, dtype_of, op_name
from aotforge.targets.tvm.rewrites.rule import Rewriter, Rule

_TRANSCENDENTAL = frozenset(
    {"relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.softmax", "relax.erf", "relax.exp", "relax.tanh"}
    | {"relax.sigmoid"}
)


class TranscendentalsInFp32(Rule):
    name = "transcendentals_in_fp32"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) in _TRANSCENDENTAL and dtype_of(call) == BF16

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        wide = rw.builder_.emit(relax.op.astype(call.args[0], "float32"))
        return relax.op.astype(rw.builder_.emit(relax.Call(call.op, [wide], call.attrs)), BF16)
