"""Latency of a runner: warm-up, then timed runs until enough samples or the time budget is spent.

:func:`benchmark` is the measuring loop; ``compiler.bench`` runs it in a process of its own (the one
``aotforge bench`` and every build's benchmark use), so the memory and threads it sees are the
runner's, not those of a build process holding torch, TVM's compiler and the source model.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable
from pathlib import Path

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
    #: Peak resident memory of the process that ran the benchmark (``compiler.bench``: the runner's own).
    peak_rss_mb: float
    std_ms: float = 0.0
    #: Threads asked of the runtime (TVM_NUM_THREADS / ORT intra-op threads), else the count OMP_NUM_THREADS gave
    #: it; 0: the runtime's own default (a thread a core).
    threads: int = 0
    #: Resident memory the artifact added to its process (peak after the runs minus before loading).
    runner_rss_mb: float = 0.0


def timed_runs(run: Callable[[Arrays], Arrays], inputs: Arrays, options: BenchOptions) -> list[float]:
    """Seconds per call of ``run(inputs)`` after ``options.warmup`` untimed calls.

    At least ``min_runs`` unless the time budget is spent first (then >= 3, or ``min_runs`` if fewer).
    """
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
    return times


def summarize(times: list[float], *, batch: int, threads: int = 0, baseline_rss_mb: float = 0.0) -> BenchResult:
    """Percentiles, mean, std and throughput of ``times`` (seconds); memory read from this process."""
    ms = np.asarray(times) * 1000.0
    p50, p90, p99 = (float(np.percentile(ms, q)) for q in (50, 90, 99))
    peak = peak_rss_mb()
    return BenchResult(
        p50_ms=round(p50, 4),
        p90_ms=round(p90, 4),
        p99_ms=round(p99, 4),
        mean_ms=round(float(ms.mean()), 4),
        std_ms=round(float(ms.std()), 4),
        throughput_per_s=round(batch * 1000.0 / p50, 3),
        runs=len(times),
        batch=batch,
        threads=threads,
        peak_rss_mb=peak,
        runner_rss_mb=round(max(peak - baseline_rss_mb, 0.0), 1),
    )


def benchmark(run: Callable[[Arrays], Arrays], inputs: Arrays, options: BenchOptions, batch: int = 1) -> BenchResult:
    """Time ``run(inputs)`` in this process (``compiler.bench`` does it in a process of its own)."""
    return summarize(timed_runs(run, inputs, options), batch=batch)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB.

    Linux's ``VmHWM`` first: ``ru_maxrss`` survives ``execve``, so a child started from a large build
    process would report the parent's peak; ``VmHWM`` belongs to the new address space.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    except (OSError, ValueError, IndexError):
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)  # KiB on Linux
