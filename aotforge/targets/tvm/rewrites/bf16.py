"""Relax pass: what TVM's CPU lowering needs from a bf16 graph (tvm target).

Three rules, each where TVM's TIR falls short on bfloat16, not the graph (the why of each is in
its module): NaN / Inf tests read an fp32 copy (``bf16_checks``), matmuls accumulate in fp32
(``bf16_matmul``), transcendentals run on fp32 (``bf16_transcendentals``). The pipeline runs
this first: fast math is fp32-only, and a ``FoldConstant`` of a bf16 ``isnan`` would compile it.
"""

from __future__ import annotations

from typing import Any

from aotforge.targets.tvm.rewrites.bf16_checks import ChecksInFp32
from aotforge.targets.tvm.rewrites.bf16_matmul import MatmulAccumulatesInFp32
from aotforge.targets.tvm.rewrites.bf16_transcendentals import TranscendentalsInFp32
from aotforge.targets.tvm.rewrites.rule import apply_rules


def rewrite_bf16(mod: Any) -> tuple[Any, dict[str, int] | None]:
    """``mod`` with the three rules applied; the counts, or ``None`` (nothing to report) for non-bf16 graphs."""
    rewritten, stats = apply_rules(mod, [ChecksInFp32(), MatmulAccumulatesInFp32(), TranscendentalsInFp32()])
    if not stats.applied:
        return mod, None
    return rewritten, dict(sorted(stats.applied.items()))
