"""Where a tvm text-generation artifact's decode step goes: per batch bucket, the step's wall and CPU time,
then each kernel's share of real steps; with ``--prompts``, the same for a prompt pass of each length.

    TVM_NUM_THREADS=2 python tools/tvm_decode_profile.py ARTIFACT_DIR [--batches 1,4] [--position 130] [--top 12]
        [--prompts 128]

The step is ``TvmStepEngine.decode`` on a zeroed cache at ``--position`` (what one token of a
generation costs there, attention included). Kernel times are taken inside real steps through the
VM's instrument hook (a timestamp before and after each call, so cold weights are paid as in a
generation, plus the hook's own few microseconds per call); ``tools/tvm_profile.py`` times kernels alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.targets.tvm.decoder.step_engine import TvmStepEngine


def step_times(engine: TvmStepEngine, batch: int, position: int, steps: int) -> tuple[float, float]:
    """p50 wall and CPU ms of one decode step at ``batch`` rows."""
    engine.start(batch, position)
    ids, pos = np.arange(1, batch + 1, dtype=np.int64)[:, None], np.full(batch, position, dtype=np.int64)
    for _ in range(3):
        engine.decode(ids, pos)
    wall, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        engine.decode(ids, pos)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return float(np.median(wall)) * 1e3, float(np.median(cpu)) * 1e3


def prompt_times(engine: TvmStepEngine, length: int, steps: int) -> tuple[float, float]:
    """p50 wall and CPU ms of one prompt pass of ``length`` tokens (a one-token generation's prefill)."""
    engine.start(1, length)
    ids = np.arange(1, length + 1, dtype=np.int64)[None, :]
    wall, cpu = [], []
    for step in range(steps + 2):
        started, cpu_started = time.perf_counter(), time.process_time()
        engine.prefill(ids, np.ones_like(ids), np.arange(length, dtype=np.int64)[None, :])
        if step >= 2:
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
    return float(np.median(wall)) * 1e3, float(np.median(cpu)) * 1e3


def kernel_times(
    engine: TvmStepEngine, batch: int, position: int, steps: int, prompt: int = 0
) -> tuple[dict[str, float], Any]:
    """Milliseconds per step (per prompt pass of ``prompt`` tokens, if given) inside each kernel (and VM
    builtin), and its calls per step."""
    engine.start(batch, max(position, prompt))
    ids, pos = np.arange(1, batch + 1, dtype=np.int64)[:, None], np.full(batch, position, dtype=np.int64)
    prompt_ids = np.arange(1, prompt + 1, dtype=np.int64)[None, :]
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    began: dict[str, float] = {}

    def instrument(_func: object, symbol: str, before: bool, _ret: object, *_args: object) -> int:
        now = time.perf_counter()
        if before:
            began[symbol] = now
        else:
            spent[symbol] += now - began[symbol]
            calls[symbol] += 1
        return 0

    engine.vm.set_instrument(instrument)
    try:
        for _ in range(steps):
            if prompt:
                engine.prefill(prompt_ids, np.ones_like(prompt_ids), np.arange(prompt, dtype=np.int64)[None, :])
            else:
                engine.decode(ids, pos)
    finally:
        engine.vm.set_instrument(None)
    return {k: v * 1e3 / steps for k, v in spent.items()}, {k: v // steps for k, v in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--position", type=int, default=130)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--prompts", default="", help="prompt lengths whose prompt pass to split too, e.g. 128")
    args = parser.parse_args()
    manifest = json.loads((args.artifact / "manifest.json").read_text())
    engine = TvmStepEngine(args.artifact, DecoderSpec.from_dict(manifest["target"]["info"]["decoder"]))
    for batch in (int(b) for b in args.batches.split(",") if b):
        wall, cpu = step_times(engine, batch, args.position, args.steps)
        spent, calls = kernel_times(engine, batch, args.position, max(args.steps // 3, 1))
        inside = sum(spent.values())
        print(f"batch {batch}: step p50 {wall:.2f} ms wall, {cpu:.2f} ms CPU; inside calls {inside:.2f} ms")
        _print(spent, calls, args.top)
    for prompt in (int(p) for p in args.prompts.split(",") if p):
        wall, cpu = prompt_times(engine, prompt, args.steps)
        spent, calls = kernel_times(engine, 1, 0, max(args.steps // 3, 1), prompt)
        print(f"prompt {prompt}: p50 {wall:.2f} ms wall, {cpu:.2f} ms CPU; inside calls {sum(spent.values()):.2f} ms")
        _print(spent, calls, args.top)


def _print(spent: dict[str, float], calls: Any, top: int) -> None:
    for name, ms in sorted(spent.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {ms:8.2f} ms x{calls[name]:<4d} {name}")


if __name__ == "__main__":
    main()
