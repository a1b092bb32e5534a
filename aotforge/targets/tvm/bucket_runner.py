"""Run-time routing over the buckets of ``targets.tvm.buckets``: check, split, pad, call, cut back.

A shape outside the declared ranges, a wrong rank, a fixed dim of the wrong size or inputs that
disagree on a dim are refused first with one ``InputSpecError`` naming what the artifact accepts
(``IOSpec.sizes_of``), before TVM sees them (its own checks fail with ``Check failed: ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from aotforge.core.spec import IOSpec
from aotforge.targets.tvm.buckets import PAD, SPLIT, BucketPlan, DimPlan

Arrays = dict[str, np.ndarray]
#: Runs one compiled function on inputs in spec order; returns the outputs in spec order.
Call = Callable[[str, Sequence[np.ndarray]], Sequence[np.ndarray]]


def run_bucketed(plan: BucketPlan, io: IOSpec, inputs: Mapping[str, np.ndarray], call: Call) -> Arrays:
    """Route one call through the plan's buckets and reassemble the outputs the source would return."""
    sizes = io.sizes_of({k: np.shape(v) for k, v in inputs.items()}, who="tvm artifact")
    split = next((d for d in plan.dims if d.how == SPLIT), None)
    arrays = {s.name: np.asarray(inputs[s.name]) for s in io.inputs}
    if split is None:
        return _run_chunk(plan, io, arrays, sizes, call)
    pieces = []
    for start, stop, size in _chunks(sizes[split.name], split.sizes):
        chunk = {k: _pad_rows(v[start:stop], size) for k, v in arrays.items()}
        out = _run_chunk(plan, io, chunk, {**sizes, split.name: size}, call)
        pieces.append({k: v[: stop - start] for k, v in out.items()})
    return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}


def _run_chunk(plan: BucketPlan, io: IOSpec, arrays: Arrays, sizes: Mapping[str, int], call: Call) -> Arrays:
    target = {d.name: _bucket_size(d, sizes[d.name]) for d in plan.dims}
    bucket = next(b for b in plan.buckets if dict(b.sizes) == target)
    padded = [_pad_dims(arrays[s.name], s.shape, sizes, target) for s in io.inputs]
    values = call(bucket.function, padded)
    return {
        spec.name: _cut_dims(np.asarray(v), spec.shape, sizes, target)
        for spec, v in zip(io.outputs, values, strict=True)
    }


def _bucket_size(dim: DimPlan, size: int) -> int:
    if dim.how == PAD:
        return min(s for s in dim.sizes if s >= size)
    return size  # split: the chunk already has a bucket size; exact: every size is a bucket


def _chunks(total: int, sizes: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, stop, bucket size)`` runs covering ``total`` rows: largest fitting bucket first."""
    out, start = [], 0
    while start < total:
        left = total - start
        fitting = [s for s in sizes if s <= left]
        size = max(fitting) if fitting else min(sizes)
        out.append((start, start + min(size, left), size))
        start += size
    return out


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    # Repeat the last row: a copy of a real row is a valid input (an all-zero one, e.g. a mask of
    # zeros, may not be); its output rows are dropped.
    short = rows - array.shape[0]
    return np.concatenate([array, np.repeat(array[-1:], short, axis=0)]) if short else array


def _pad_dims(array: np.ndarray, shape: Sequence[int | str], sizes: Mapping[str, int], target: Mapping[str, int]):
    widths = [(0, target[d] - sizes[d]) if isinstance(d, str) and d in target else (0, 0) for d in shape]
    arr = np.pad(array, widths) if any(w for _, w in widths) else array
    return np.require(arr, requirements="C")  # keeps a 0-d input 0-d


def _cut_dims(array: np.ndarray, shape: Sequence[int | str], sizes: Mapping[str, int], target: Mapping[str, int]):
    index = tuple(
        slice(0, sizes[d]) if isinstance(d, str) and d in target and target[d] != sizes[d] else slice(None)
        for d in shape
    )
    return array[index] if len(index) == array.ndim else array
