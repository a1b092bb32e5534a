"""How the reference casts float32 to a narrow float (``onnx.reference``'s ``cast_to``), as a search table.

``importable/narrow.py`` rewrites a cast to a float8 type into a binary search among the float32 values where
the reference's byte changes; :func:`encoding` finds those breakpoints once per (type, saturate, round mode).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from onnx import helper


@functools.cache
def encoding(target: int, saturate: bool, round_mode: str) -> tuple[np.ndarray, np.ndarray, int, tuple[int, int]]:
    """How the reference casts float32 to ``target``: (bounds, codes, NaN's byte, (-0's byte, +0's byte)).

    ``bounds`` (float32, ascending, padded with +inf to 2**k - 1) are the least values whose byte
    changes, ``codes`` (uint8, 2**k, padded with the last) the byte from each bound on. Found by
    bisection over the float32 values in order, between consecutive values the type represents
    (where the reference's rounding is monotone).
    """

    def cast(keys: np.ndarray) -> np.ndarray:
        return _reference_bytes(_floats(keys), target, saturate, round_mode)

    with np.errstate(all="ignore"):
        decoded = np.arange(256, dtype=np.uint8).view(numpy_dtype(target)).astype(np.float32)
    finite = decoded[~np.isnan(decoded)]
    ends = np.array([-np.inf, -0.0, 0.0, np.inf], np.float32)  # and mirrored values: e8m0 has no sign
    anchors = np.unique(np.concatenate([_keys(finite), _keys(-finite), _keys(ends)]))
    bounds: list[int] = []
    codes = [int(cast(anchors[:1])[0])]
    for a, b in zip(anchors[:-1], anchors[1:], strict=True):
        lo, current = int(a), codes[-1]
        while int(cast(np.array([b]))[0]) != current:
            left, right = lo, int(b)  # cast(left) == current != cast(right)
            while right - left > 1:
                middle = (left + right) // 2
                if int(cast(np.array([middle]))[0]) == current:
                    left = middle
                else:
                    right = middle
            current = int(cast(np.array([right]))[0])
            bounds.append(right)
            codes.append(current)
            lo = right
    size = 1 << max(1, int(np.ceil(np.log2(len(codes)))))
    padded_bounds = np.full(size - 1, np.inf, np.float32)
    padded_bounds[: len(bounds)] = _floats(np.array(bounds, np.int64))
    padded_codes = np.full(size, codes[-1], np.uint8)
    padded_codes[: len(codes)] = codes
    nan = int(_reference_bytes(np.array([np.nan], np.float32), target, saturate, round_mode)[0])
    zeros = _reference_bytes(np.array([-0.0, 0.0], np.float32), target, saturate, round_mode)
    return padded_bounds, padded_codes, nan, (int(zeros[0]), int(zeros[1]))


def _reference_bytes(x: np.ndarray, target: int, saturate: bool, round_mode: str) -> np.ndarray:
    from onnx.reference.ops.op_cast import cast_to

    with np.errstate(all="ignore"):
        return np.asarray(cast_to(x, target, saturate, round_mode)).view(np.uint8)  # type: ignore[arg-type]


def _keys(x: Any) -> np.ndarray:
    """float32 values -> int64 keys in the order of the values (-0 just below +0)."""
    bits = np.asarray(x, np.float32).reshape(-1).view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF) - 1, bits)


def _floats(keys: np.ndarray) -> np.ndarray:
    keys = np.asarray(keys, np.int64)
    bits = np.where(keys < 0, (-(keys + 1)) | 0x80000000, keys)
    return bits.astype(np.uint32).view(np.float32)


def numpy_dtype(element_type: int) -> np.dtype:
    """The numpy dtype of an ONNX element type (narrow ones through ml_dtypes)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(element_type))
