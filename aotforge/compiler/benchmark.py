"""Latency of a runner: warm-up, then timed runs until enough samples or the time budget is spent."""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable

import numpy as np

from aotforge.compiler.source import Arrays


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    warmup: int = 5
    min_runs: int = 30
    max_runs: int = 500
    max_seconds: float = 10.0


@dataclasses.dataclass(frozen=True)
class BenchResult:
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    throughput_per_s: float
    runs: int
    batch: int
    peak_rss_mb: float


def benchmark(run: Callable[[Arrays], Arrays], inputs: Arrays, options: BenchOptions, batch: int = 1) -> BenchResult:
    """Time ``run(inputs)``. At least ``min_runs`` unless one run alone exceeds the budget (then >= 3)."""
    for _ in range(options.warmup):
        run(inputs)
    times: list[float] = []
    deadline = time.perf_counter() + options.max_seconds
    while len(times) < options.max_runs:
        start = time.perf_counter()
        run(inputs)
        times.append(time.perf_counter() - start)
        if time.perf_counter() > deadline and len(times) >= min(3, options.min_runs):
            break
    ms = np.asarray(times) * 1000.0
    p50, p90, p99 = (float(np.percentile(ms, q)) for q in (50, 90, 99))
    return BenchResult(
        p50_ms=round(p50, 4),
        p90_ms=round(p90, 4),
        p99_ms=round(p99, 4),
        mean_ms=round(float(ms.mean()), 4),
        throughput_per_s=round(batch * 1000.0 / p50, 3),
        runs=len(times),
        batch=batch,
        # Peak resident memory of the whole build process, not of the runner alone.
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
    )
