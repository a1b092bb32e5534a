"""Time aotforge artifacts side by side: each in its own process, round-robin, through ``aotforge.load``.

ORT and TVM thread pools spin after a call, so two runtimes timed in one process slow each other;
and the host is shared, so rounds alternate the artifacts and ratios are taken within a round.

    python tools/artifact_timing.py ARTIFACT FEED.npz RUNS     # worker: prints {"ms": p50}
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def time_artifact(artifact: Path, feed_file: Path, runs: int) -> float:
    """p50 ms of ``runs`` calls after warm-up, in this process."""
    import numpy as np

    import aotforge
    from aotforge.compiler.benchmark import BenchOptions, benchmark

    feed = dict(np.load(feed_file))
    runner = aotforge.load(artifact)
    options = BenchOptions(warmup=10, min_runs=runs, max_runs=runs, max_seconds=float("inf"))
    return benchmark(runner.run, feed, options).p50_ms


def round_robin(artifacts: dict[str, Path], feed_file: Path, rounds: int, runs: int) -> dict[str, list[float]]:
    """Per artifact, its p50 in each round; every measurement in a fresh process."""
    times: dict[str, list[float]] = {name: [] for name in artifacts}
    for _ in range(rounds):
        for name, path in artifacts.items():
            cmd = [sys.executable, __file__, str(path), str(feed_file), str(runs)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
            times[name].append(json.loads(out.strip().splitlines()[-1])["ms"])
    return times


def ratio(times: dict[str, list[float]], name: str, base: str) -> float:
    """Median over rounds of ``name``'s time over ``base``'s in the same round (steadier under load)."""
    return statistics.median(t / b for t, b in zip(times[name], times[base], strict=True))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(json.dumps({"ms": time_artifact(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))}))
