"""A neuron artifact's buckets: the static shape sets it compiled, and how a call is routed to one.

Neuron graphs are static, so each dynamic dim has a declared set of sizes and every combination is a
bucket, one compiled graph (``target.plan_buckets``). A call goes to the smallest bucket its shapes
fit, its inputs zero-padded up to it along the dims padding leaves correct, its outputs cut back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from aotforge.core.errors import InputSpecError
from aotforge.core.spec import IOSpec
from aotforge.targets.base import Arrays


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One static shape set: a size for every named dim."""

    sizes: tuple[tuple[str, int], ...]

    @property
    def key(self) -> str:
        return "-".join(f"{name}{size}" for name, size in self.sizes) or "static"

    @property
    def file(self) -> str:
        return f"model.{self.key}.neuron.pt"

    def shapes(self, io: IOSpec) -> dict[str, tuple[int, ...]]:
        return {spec.name: spec.bind(dict(self.sizes)) for spec in io.inputs}

    def volume(self) -> int:
        return int(np.prod([s for _, s in self.sizes])) if self.sizes else 1


def actual_sizes(io: IOSpec, inputs: Arrays) -> dict[str, int]:
    """The size each named dim takes in this call; inputs must agree and fixed dims must match."""
    sizes: dict[str, int] = {}
    for spec in io.inputs:
        if spec.name not in inputs:
            raise InputSpecError(f"neuron model needs input {spec.name!r}; got {', '.join(inputs)}")
        shape = inputs[spec.name].shape
        if len(shape) != len(spec.shape):
            raise InputSpecError(f"neuron input {spec.name!r} has rank {len(shape)}, the model takes {len(spec.shape)}")
        for dim, got in zip(spec.shape, shape, strict=True):
            want = sizes.setdefault(dim, got) if isinstance(dim, str) else dim
            if got != want:
                raise InputSpecError(f"neuron input {spec.name!r} has shape {shape}, expected {list(spec.shape)}")
    return sizes


def route(buckets: tuple[Bucket, ...], sizes: Mapping[str, int], pad_dims: tuple[str, ...]) -> Bucket:
    """The smallest bucket that holds ``sizes``, padding only dims the model allows padding on."""

    def fits(bucket: Bucket) -> bool:
        return all(s == sizes[n] or (s > sizes[n] and n in pad_dims) for n, s in bucket.sizes)

    candidates = [b for b in buckets if fits(b)]
    if not candidates:
        have = ", ".join(b.key for b in buckets)
        raise InputSpecError(
            f"neuron: no compiled bucket fits {dict(sizes)} (buckets: {have}; paddable dims: "
            f"{', '.join(pad_dims) or 'none'}): add a bucket of that size, or allow padding with pad_dims"
        )
    return min(candidates, key=Bucket.volume)


def pad_inputs(io: IOSpec, inputs: Arrays, bucket: Bucket) -> list[np.ndarray]:
    """Inputs in model order, zero-padded at the end of each named dim up to the bucket size."""
    target = dict(bucket.sizes)
    padded = []
    for spec in io.inputs:
        array = inputs[spec.name]
        widths = [(0, target[d] - n if isinstance(d, str) else 0) for d, n in zip(spec.shape, array.shape, strict=True)]
        padded.append(np.pad(array, widths) if any(w for _, w in widths) else array)
    return padded


def unpad_outputs(io: IOSpec, outputs: list[np.ndarray], sizes: Mapping[str, int]) -> Arrays:
    """Cut padded rows back off every output dim named like an input dim."""
    result = {}
    for spec, array in zip(io.outputs, outputs, strict=True):
        index = tuple(slice(0, sizes[d]) if isinstance(d, str) and d in sizes else slice(None) for d in spec.shape)
        result[spec.name] = array[index] if len(index) == array.ndim else array
    return result


def bucket_of(pairs: list[list[Any]]) -> Bucket:
    # Pairs, not a dict: the manifest is written with sorted keys and dim order must survive.
    return Bucket(tuple((str(n), int(s)) for n, s in pairs))
