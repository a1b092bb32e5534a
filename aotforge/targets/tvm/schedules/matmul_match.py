"""What the tiled matmul rule (``matmul.py``) and its weight packing (``weight_packing.py``) match.

A PrimFunc qualifies when its single reduction block is a sum of products
(``C[...] += A[...] * B[...]``) with static extents and the reduction iterators after the spatial
ones. :func:`match` finds it and names its axes: ``j``, the last spatial axis (the vector axis),
and ``i``, the innermost spatial axis of the operand that does not depend on ``j`` (the
"broadcast" operand: ``A`` of a matmul, the weights of a convolution).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tvm import s_tir, tirx
from tvm.tirx.analysis import undefined_vars


@dataclasses.dataclass(frozen=True)
class Matmul:
    """What the rule found: the reduction block (``infos[at]``), its ``n_s`` spatial loops, the
    vector axis ``j`` (the last) and broadcast axis ``i`` (-1: none), their extents ``n``, ``m``."""

    at: int
    block: Any
    n_s: int
    i: int
    j: int
    m: int
    n: int
    #: multiply-adds: the product of every loop extent of the reduction block
    macs: int


def same_buffer(a: Any, b: Any) -> bool:
    return bool(a.same_as(b) or (getattr(a, "name", None) is not None and getattr(a, "name", None) == b.name))


def source(e: Any) -> Any:
    """The buffer of a load or region (TVM 0.27: ``ir.TensorLoad`` / ``ir.TensorRegion`` with ``source``)."""
    return getattr(e, "buffer", None) or getattr(e, "source", None)


def _strip_cast(e: Any) -> Any:
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


def _loads_from(e: Any, buffer: Any) -> bool:
    src = source(e)
    return src is not None and hasattr(e, "indices") and same_buffer(src, buffer)


def _is_sum_of_products(block: tirx.SBlock) -> bool:
    store = block.body
    if not isinstance(store, tirx.BufferStore) or block.init is None:
        return False
    value = store.value
    if not isinstance(value, tirx.Add):
        return False
    for acc, term in ((value.a, value.b), (value.b, value.a)):
        if _loads_from(acc, store.buffer):
            return isinstance(_strip_cast(term), tirx.Mul)
    return False


def _vars_in(region: Any) -> list[Any]:
    return [v for rng in region.region for v in undefined_vars(rng.min)]


def _broadcast_axis(block: tirx.SBlock, spatial: list[Any], j: int) -> int:
    """The innermost spatial iterator of an operand that does not depend on ``j`` (-1: none)."""
    i = -1
    operands = [r for r in block.reads if not same_buffer(source(r), source(block.writes[0]))]
    for region in operands:
        used = _vars_in(region)
        if any(v.same_as(spatial[j].var) for v in used):
            continue
        for k in range(j - 1, -1, -1):
            if any(v.same_as(spatial[k].var) for v in used):
                i = max(i, k)
                break
    if i < 0 and j > 0:
        i = j - 1
    return i


def match(sch: s_tir.Schedule, infos: list[Any]) -> Matmul | None:
    """The one sum-of-products reduction with static extents and spatial loops first, else ``None``."""
    reductions = [k for k, b in enumerate(infos) if not b.is_injective()]
    if len(reductions) != 1:
        return None
    at = reductions[0]
    red_info = infos[at]
    kinds = red_info.dom_kind()
    n_s = len(kinds) - len(kinds.lstrip("S"))
    if n_s == 0 or set(kinds[n_s:]) != {"R"}:
        return None
    if any(not isinstance(d, int | tirx.IntImm) for d in red_info.dom()):
        return None  # static shapes only
    block = sch.get(red_info.block_rv)
    if not _is_sum_of_products(block) or len(block.reads) < 2:
        return None
    spatial = red_info.iters[:n_s]
    j = n_s - 1
    i = _broadcast_axis(block, spatial, j)
    m = int(spatial[i].dom) if i >= 0 else 1  # type: ignore[arg-type]
    n = int(spatial[j].dom)  # type: ignore[arg-type]
    if n * m < 4:
        return None  # nothing to tile: let GEMV / Reduction take it
    macs = 1
    for d in red_info.dom():
        macs *= int(d)
    return Matmul(at, red_info.block_rv, n_s, i, j, m, n, macs)
