"""The bandwidth floor of a decode step: its weight bytes over the read bandwidth of the threads it runs on.

A fp32 decode step reads every weight once, so no runtime's step is faster than streaming them at the
bandwidth a few threads get from memory (measured here as numpy sums, which release the GIL).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def read_bandwidth_gbs(threads: int) -> float:
    """``threads`` threads each summing its share of 512 MiB, best of 3: the floor's denominator, read the way a
    decode step reads its weights."""
    from concurrent.futures import ThreadPoolExecutor

    data = np.ones(128 * 1024 * 1024, dtype=np.float32)
    parts = np.array_split(data, threads)
    with ThreadPoolExecutor(threads) as pool:
        best = min(_timed(lambda: list(pool.map(np.sum, parts))) for _ in range(3))
    return data.nbytes / best / 1e9


def floor_ms(nbytes: int, gbs: float) -> float:
    """Milliseconds to read ``nbytes`` at ``gbs`` GB/s."""
    return round(nbytes / (gbs * 1e9) * 1000.0, 2)


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
