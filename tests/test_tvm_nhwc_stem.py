"""The vectorized stem input (``kernels.nhwc_stem``) writes the same bytes as ``nhwc_input.to_nhwc_padded``."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from aotforge.targets.tvm.kernels import nhwc_input, nhwc_stem
from tests.int8_graphs import host_target


def _run(func: object, arrays: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func}), target=host_target())
    args = [tvm.runtime.tensor(v) for v in (*arrays, np.zeros(out_shape, np.uint8))]
    lib["main"](*args)
    return args[-1].numpy()


@pytest.mark.parametrize(
    ("shape", "padding", "quantize"),
    [
        ((1, 3, 20, 32), (1, 1, 1, 1), True),  # whole runs of 16 pixels
        ((2, 3, 9, 21), (3, 2, 0, 1), True),  # a row's last 5 pixels one by one, uneven padding, batch 2
        ((1, 1, 4, 16), (0, 0, 0, 0), False),  # uint8 input, one channel, no padding
    ],
)
def test_stem_input_matches_the_per_pixel_kernel(
    shape: tuple[int, int, int, int], padding: tuple[int, int, int, int], quantize: bool
) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4).astype(np.float32) if quantize else rng.integers(0, 256, shape, np.uint8)
    arrays = [x, *([np.array(0.031, np.float32)] if quantize else []), np.array(117, np.uint8)]
    top, left, bottom, right = padding
    out_shape = (shape[0], shape[2] + top + bottom, shape[3] + left + right, 4)
    assert nhwc_stem.supports(shape, 4)
    expected = _run(nhwc_input.to_nhwc_padded(shape, padding, 4, quantize=quantize), arrays, out_shape)
    got = _run(nhwc_stem.to_nhwc4(shape, padding, quantize=quantize), arrays, out_shape)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 40  # not all clipped / all padding
