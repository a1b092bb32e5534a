"""Four int32 vectors of 8-bit values as one vector of 64 bytes, interleaved: ``values[k][i]`` at byte ``4i + k``.

The order ``vpdpbusd`` reads (4 bytes per int32 lane) and the order of a 4-channel NHWC pixel run:
``a0 | a1 << 8 | a2 << 16 | a3 << 24`` is 6 vector instructions, where a byte shuffle of the four
narrowed vectors would be a gather or a chain of permutes.
"""

from __future__ import annotations

from typing import Any

from tvm import tirx


def interleave_bytes(values: list[Any], out_dtype: str) -> Any:
    """``values`` (4 ``int32x16`` holding ``out_dtype`` values) as one ``out_dtype x 64`` vector."""
    packed = values[3] << 24
    for k in range(3):
        low = values[k] if out_dtype == "uint8" else values[k] & 255  # an int8's sign bits cleared
        packed = packed | (low << (8 * k))
    return tirx.reinterpret(f"{out_dtype}x64", packed)
