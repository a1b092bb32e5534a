"""Seeded inputs that respect each input's dtype and value range (ids within the vocabulary, 0/1 masks)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from aotforge.compiler.source import Arrays
from aotforge.core.spec import IOSpec, TensorSpec


def make_inputs(io: IOSpec, sizes: Mapping[str, int], *, seed: int, count: int) -> list[Arrays]:
    """``count`` input sets for the shapes in ``sizes``, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [{spec.name: _one(spec, spec.bind(sizes), rng) for spec in io.inputs} for _ in range(count)]


def _one(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        lo, hi = spec.value_range or _default_int_range(spec.name)
        values = rng.integers(int(lo), max(int(hi), int(lo) + 1), size=shape).astype(dtype)
        if _is_mask(spec.name) and values.ndim and values.shape[-1] and hi > 1:
            # Real masks attend to the first token ([CLS]); an all-zero row pools to a zero
            # vector, where cosine is undefined and a 1e-4 fp16 residue reads as cosine 0.
            values[..., 0] = 1
        return values
    if spec.value_range is not None:
        lo, hi = spec.value_range
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def _default_int_range(name: str) -> tuple[int, int]:
    # Unknown integer inputs: masks are 0/1, anything else gets small non-negative ids.
    return (0, 2) if _is_mask(name) else (0, 8)


def _is_mask(name: str) -> bool:
    return "mask" in name.lower()
