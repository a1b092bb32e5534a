"""Compile-time packing of the constant matmul weights the tiled rule (``matmul.py``) reads.

A constant ``W[K, N]`` is read as ``[N / tj, K, tj]``: each j tile's K x tj panel contiguous. The
copy is a layout-rewrite block that ``SplitLayoutRewritePreproc`` + ``FoldConstant`` move out and
run at compile time (``steps._prepack_weights``), as MLAS pre-packs B. A model whose weights do not
stay in L2 streams them from L3 every call; read with the row stride of N, a panel is tj columns of
K rows, packed it is one contiguous run that the prefetchers stream (no gain when the weights stay in L2;
figures: docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx

from aotforge.targets.tvm.schedules.matmul_match import Matmul, same_buffer, source

#: The attribute Relax's ``AttachAttrLayoutFreeBuffers`` puts on a PrimFunc (indices of its parameters
#: that are constants or weights) and the block annotation ``SplitLayoutRewritePreproc`` moves out.
LAYOUT_FREE = "layout_free_buffers"
PREPROC = "meta_schedule.layout_rewrite_preproc"
#: The attribute the rule puts on a PrimFunc it gave a layout-rewrite block: what ``prepack_weights``
#: looks for (TVM 0.27's Python API has no TIR visitor to find the block itself without printing).
PACKED = "aotforge.packed_weight"


def _weight_read(sch: s_tir.Schedule, mm: Matmul, func: tirx.PrimFunc) -> int:
    """Index among the reduction block's reads of a constant 2-D weight ``W[k, j]`` (-1: none)."""
    free = func.attrs.get(LAYOUT_FREE) if func.attrs is not None else None
    if not free:
        return -1
    # TVM 0.27: a parameter is its buffer (it has a name, shape and data)
    weights = [func.params[int(k)] for k in free]
    block = sch.get(mm.block)
    j_var = block.iter_vars[mm.j].var
    r_vars = [iv.var for iv in block.iter_vars[mm.n_s :]]
    for idx, region in enumerate(block.reads):
        buf = source(region)
        if not any(same_buffer(buf, w) for w in weights) or len(region.region) != 2 or len(r_vars) != 1:
            continue
        k_min, j_min = (rng.min for rng in region.region)
        if k_min.same_as(r_vars[0]) and j_min.same_as(j_var):
            return idx
    return -1


def pack_weight(sch: s_tir.Schedule, mm: Matmul, func: tirx.PrimFunc, tj: int) -> s_tir.Schedule | None:
    """A copy of ``sch`` that reads ``func``'s constant weight packed in j tiles of ``tj``, or ``None``.

    The work is done on a copy, so a refusal leaves ``sch`` as it was; ``sch``'s block and loop
    variables stay valid in the copy. Mark the function with :func:`mark_packed` once scheduled.
    """
    idx = _weight_read(sch, mm, func)
    if idx < 0 or tj >= mm.n or mm.n % tj:
        return None
    packed = sch.copy()
    try:
        copy = packed.cache_read(mm.block, idx, "global")
        packed.annotate(copy, PREPROC, True)
        packed.transform_layout(mm.block, ("read", idx), lambda k, j: (j // tj, k, j % tj))
    except Exception:  # a schedule error: leave the weight as stored
        return None
    return packed


def mark_packed(sch: s_tir.Schedule) -> s_tir.Schedule:
    """``sch`` with its function marked as holding a layout-rewrite block (:data:`PACKED`)."""
    return s_tir.Schedule(sch.mod["main"].with_attr(PACKED, True))


def has_packed_weights(mod: Any) -> bool:
    """Some PrimFunc of ``mod`` reads a weight the rule packed (a layout-rewrite block to split out)."""
    return any(
        isinstance(func, tirx.PrimFunc) and func.attrs is not None and bool(func.attrs.get(PACKED, False))
        for _, func in mod.functions_items()
    )
