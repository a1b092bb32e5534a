"""The requantizing write-back an integer convolution kernel can carry (``rewrites/int8_epilogue``).

A static ``int8`` CNN turns each convolution's int32 result back into the next convolution's
8-bit input: scale per output channel, add the bias, clip (ReLU / ReLU6), divide by the next
scale, round, add the zero point. Run as its own kernel, that reads the int32 tile back from
memory, writes float, reads it again and writes bytes: at MobileNet sizes (a few microseconds of
integer work per convolution) the launch and the traffic cost as much as the convolution. Folded
into one affine map and a clamp per channel, it rides the kernel's write-back on the tile while
it is still in registers:

    out[..., j] = clamp(round(acc[..., j] * scale[j] + shift[j]), low[j], high[j])

with the zero point in ``shift`` and the clip bounds (rounded, then met with the output type's
range) in ``low`` / ``high``. Round-then-clamp equals clip-then-round because rounding is
monotone; only the float rounding of the folded constants differs from the op-by-op form.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

#: rows of the epilogue table: scale, shift, low, high (one float per output channel each)
ROWS = 4

#: 8-bit outputs the write-back can produce, with their ranges
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def placeholder(channels: int) -> Any:
    """The kernel's epilogue table parameter ``f32[ROWS, channels]``."""
    return te.placeholder((ROWS, channels), "float32", name="requantize")


def apply(acc: Any, table: Any, j: Any, out_dtype: str) -> Any:
    """``acc`` (an int32 expression of output channel ``j``) requantized to ``out_dtype`` by ``table``."""
    value = tirx.round(acc.astype("float32") * table[0, j] + table[1, j])
    return tirx.min(tirx.max(value, table[2, j]), table[3, j]).astype(out_dtype)


def table(scale: np.ndarray, shift: np.ndarray, low: np.ndarray, high: np.ndarray, out_dtype: str) -> np.ndarray:
    """The ``f32[ROWS, C]`` table for the map ``round(acc * scale + shift)`` clamped to
    ``[low, high]`` (already rounded and including the zero point) and to ``out_dtype``'s range."""
    lo, hi = RANGES[out_dtype]
    bounds = np.clip(low, lo, hi), np.clip(high, lo, hi)
    return np.stack([scale, shift, *bounds]).astype(np.float32)


def reference(acc: np.ndarray, rows: np.ndarray, out_dtype: str) -> np.ndarray:
    """What the write-back computes, in numpy (channels last), for tests: the multiply-add is one
    fused rounding (LLVM contracts it to an FMA), which float64 gives for float32 operands."""
    fused = acc.astype(np.float32).astype(np.float64) * rows[0].astype(np.float64) + rows[1]
    value = np.round(fused.astype(np.float32))
    return np.minimum(np.maximum(value, rows[2]), rows[3]).astype(out_dtype)
