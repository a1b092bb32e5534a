"""Checking a user's sample inputs against the model's IO spec, all problems in one error.

Names must be the model's inputs, every one of them. A dtype must be the input's, or of the
same kind and hold the same values in it (int32 ids for an int64 input, float64 for float32:
what numpy and Python make by default). Ranks and fixed dims must match; a named dim must have
one size within a sample and lie in its declared ``--dynamic`` range. Named dims no
``--dynamic`` declares take the range the samples span (``opt`` = the first sample's size), so
that the artifact is built for the shapes it is validated on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aotforge.compiler.source import Arrays
from aotforge.core.errors import InputSpecError
from aotforge.core.spec import DimRange, IOSpec, TensorSpec


def check_samples(io: IOSpec, samples: Sequence[Mapping[str, Any]], where: str) -> tuple[list[Arrays], IOSpec]:
    """The samples cast to the inputs' dtypes and the spec with the dims they bind; or one InputSpecError."""
    if not samples:
        raise InputSpecError(f"sample inputs {where} hold no samples: give at least one")
    problems: list[str] = []
    checked: list[Arrays] = []
    seen: dict[str, list[int]] = {}
    for index, sample in enumerate(samples):
        prefix = f"sample {index}: " if len(samples) > 1 else ""
        arrays, sizes, found = _check_one(io, sample)
        problems.extend(prefix + p for p in found)
        checked.append(arrays)
        for dim, size in sizes.items():
            seen.setdefault(dim, []).append(size)
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise InputSpecError(
            f"sample inputs {where} do not fit the model's inputs ({_describe_inputs(io)}): {shown}; "
            "fix the data, or declare the dims' ranges with --dynamic"
        )
    return checked, _with_sample_dims(io, seen)


def _check_one(io: IOSpec, sample: Mapping[str, Any]) -> tuple[Arrays, dict[str, int], list[str]]:
    problems = []
    names = [s.name for s in io.inputs]
    missing = [n for n in names if n not in sample]
    extra = sorted(str(n) for n in sample if n not in names)
    if missing:
        problems.append(f"missing input(s) {', '.join(missing)}")
    if extra:
        problems.append(f"unknown input(s) {', '.join(extra)}")
    arrays: Arrays = {}
    sizes: dict[str, int] = {}
    owners: dict[str, str] = {}
    for spec in io.inputs:
        if spec.name not in sample:
            continue
        array, problem = _cast(spec, np.asarray(sample[spec.name]))
        if problem:
            problems.append(problem)
            continue
        arrays[spec.name] = array
        problems.extend(_check_shape(io, spec, array.shape, sizes, owners))
    return arrays, sizes, problems


def _cast(spec: TensorSpec, array: np.ndarray) -> tuple[np.ndarray, str]:
    want = np.dtype(spec.dtype)
    if array.dtype == want:
        return array, ""
    refusal = f"input {spec.name} is {array.dtype}, the model takes {want}"
    if array.dtype.kind in "iu" and want.kind in "iu":
        cast = array.astype(want)
        return (cast, "") if np.array_equal(cast, array) else (array, refusal + " (values do not fit)")
    if array.dtype.kind == "f" and want.kind == "f":
        return array.astype(want), ""
    return array, refusal


def _check_shape(
    io: IOSpec, spec: TensorSpec, shape: tuple[int, ...], sizes: dict[str, int], owners: dict[str, str]
) -> list[str]:
    if len(shape) != len(spec.shape):
        return [f"input {spec.name} has shape {list(shape)}, the model takes rank {len(spec.shape)} {_shape(spec)}"]
    problems = []
    for axis, (dim, size) in enumerate(zip(spec.shape, shape, strict=True)):
        if isinstance(dim, int):
            if dim != size:
                problems.append(f"input {spec.name} dim {axis} is {size}, the model fixes it at {dim}")
            continue
        if dim in sizes and sizes[dim] != size:
            problems.append(f"dim {dim} is {sizes[dim]} in input {owners[dim]} but {size} in input {spec.name}")
            continue
        sizes[dim], owners[dim] = size, spec.name
        declared = io.dim(dim)
        if declared is not None and not declared.min <= size <= declared.max:
            problems.append(
                f"input {spec.name} dim {dim} is {size}, outside its declared range {declared.min}..{declared.max}"
            )
    return problems


def _with_sample_dims(io: IOSpec, seen: Mapping[str, list[int]]) -> IOSpec:
    added = tuple(
        DimRange(name, min(sizes), sizes[0], max(sizes))
        for name, sizes in seen.items()
        if io.dim(name) is None and min(sizes) >= 1
    )
    return dataclasses.replace(io, dims=io.dims + added) if added else io


def _shape(spec: TensorSpec) -> str:
    return "[" + ", ".join(str(d) for d in spec.shape) + "]"


def _describe_inputs(io: IOSpec) -> str:
    return ", ".join(f"{s.name}: {s.dtype} {_shape(s)}" for s in io.inputs)
