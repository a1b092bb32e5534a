"""How the generation benchmark times one runtime's decoding, the same way for every runtime.

A runtime hands :func:`measure` a ``once(rows, n)`` that decodes ``n`` tokens for ``rows`` prompts and returns
the wall time (from the start) at which each token arrived.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: TTFT is the median of this many one-token calls: a single prompt pass moves with every spike of load.
TTFT_CALLS = 5

Once = Callable[[int, int], list[float]]


def measure(once: Once, new: int, batch: int) -> dict[str, Any]:
    """Warm-up, batch 1 (wall marks per token and CPU time per decoded token), then batch ``batch``."""
    once(1, 4)
    cpu = time.process_time()
    marks = once(1, new)
    cpu_ms = (time.process_time() - cpu) * 1000.0 / new
    result = summary(marks)
    result["ttft_ms"] = round(float(np.median([once(1, 1)[0] for _ in range(TTFT_CALLS)])) * 1000.0, 2)
    wide = once(batch, new)
    tps = batch * (len(wide) - 1) / (wide[-1] - wide[0])
    return {**result, "cpu_ms_per_token": round(cpu_ms, 2), f"tokens_per_s_batch{batch}": round(tps, 2)}


def summary(marks: list[float]) -> dict[str, Any]:
    """TTFT, inter-token latency percentiles and tokens/s of one call's marks."""
    itl = np.diff(marks) * 1000.0
    return {
        "ttft_ms": round(marks[0] * 1000.0, 2),
        "itl_p50_ms": round(float(np.percentile(itl, 50)), 3),
        "itl_p90_ms": round(float(np.percentile(itl, 90)), 3),
        "itl_p99_ms": round(float(np.percentile(itl, 99)), 3),
        "tokens_per_s": round(len(itl) / (marks[-1] - marks[0]), 2),
    }
