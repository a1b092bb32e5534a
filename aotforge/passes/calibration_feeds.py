"""The feeds a quantization pass calibrates on: the user's calibration set (``core.calibration``) read against the
graph's inputs, or seeded random ones when there is none (fine for tests, poor for accuracy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir

from aotforge.core.calibration import Feeds, load_calibration
from aotforge.core.errors import OptionsError


def load_samples(model: ir.Model, source: Path | str, limit: int) -> list[Feeds]:
    """Calibration feeds from a directory of .npz / .npy files or ``module.py:function``."""
    inputs = {
        str(v.name): (len(v.shape) if v.shape is not None else -2, v.dtype.numpy() if v.dtype is not None else None)
        for v in model.graph.inputs
        if v.name not in model.graph.initializers
    }
    try:
        return load_calibration(str(source), inputs, limit)
    except OptionsError as e:
        raise OptionsError(f"pass int8: {e}") from e


def random_samples(model: ir.Model, count: int, seed: int) -> list[Feeds]:
    """Seeded feeds of each input's shape (dynamic dims as 1): normal floats, 0/1 integers."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        feeds = {}
        for value in model.graph.inputs:
            if value.name in model.graph.initializers or value.name is None:
                continue
            shape = [d if isinstance(d, int) else 1 for d in (value.shape or ())]
            dtype = value.dtype.numpy() if value.dtype is not None else np.dtype(np.float32)
            if np.issubdtype(dtype, np.floating):
                feeds[value.name] = rng.standard_normal(shape).astype(dtype)
            else:
                feeds[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
        samples.append(feeds)
    return samples
