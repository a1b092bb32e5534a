"""Where a speculative round's time goes: each engine call timed alone, and the speed-up a free loop would reach.

On the artifacts ``tools/bench_speculative.py`` built into --work for --target (onnxruntime or tvm; built here if
missing), in one process: the CPU time of a target decode step, of a verify call of each width 1 .. max(--ks) + 1,
of a draft decode step and of each model's prefill (medians of --reps alternating batches, after warm-up). Then,
per k, one speculative run over the bench's prompts counts rounds and draft calls, and the time per token those
calls cost alone (a loop with no Python of its own and every call as fast as alone) is set against target-only
decoding at the same cost: the bound on the speed-up this host and pair allow, next to the speed-up the same
process measures (what the loop and cold caches take is the difference).

    python tools/speculative_costs.py --work /tmp/aotforge-spec-bench [--ks 2,3,4] [--target tvm]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_speculative import build, max_seq_len, models  # tools/, beside this script


def per_call_us(calls: dict[str, Callable[[int], Any]], reps: int, batch: int = 200) -> dict[str, float]:
    """Thread CPU time per call of each, in microseconds: ``reps`` alternating batches, medians."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            for i in range(batch // 4):
                call(i)
            start = time.thread_time()
            for i in range(batch):
                call(i)
            times[name].append((time.thread_time() - start) / batch * 1e6)
    return {name: float(np.median(t)) for name, t in times.items()}


def engine_costs(target: Any, draft: Any, prompt: list[int], width: int, reps: int) -> dict[str, float]:
    """Each kind of engine call, alone, with the prompt in the cache (writes move over 64 positions)."""
    ids = np.array([prompt], dtype=np.int64)
    n = ids.shape[1]
    mask, positions = np.ones_like(ids), np.arange(n, dtype=np.int64)[None, :]
    for engine in (target, draft):
        engine.start(1, n)
        engine.prefill(ids, mask, positions)
    one = np.array([[ids[0, -1]]], dtype=np.int64)

    def at(i: int) -> np.ndarray:
        return np.array([n + i % 64], dtype=np.int64)

    calls: dict[str, Callable[[int], Any]] = {
        "target decode": lambda i: target.decode(one, at(i)),
        "draft decode": lambda i: draft.decode(one, at(i)),
    }
    for w in range(1, width + 1):
        block = np.repeat(one, w, axis=1)
        calls[f"verify {w}"] = lambda i, block=block: target.verify(block, at(i))
    costs = per_call_us(calls, reps)
    prefills = {
        "target prefill": lambda i: (target.start(1, n), target.prefill(ids, mask, positions)),
        "draft prefill": lambda i: (draft.start(1, n), draft.prefill(ids, mask, positions)),
    }
    return costs | per_call_us(prefills, reps, batch=8)


def bound(costs: dict[str, float], stats: list[dict[str, Any]], k: int, new: int) -> dict[str, float]:
    """CPU us per token of target-only decoding and of speculative decoding at ``k`` from the calls alone."""
    prompts = len(stats)
    rounds, draft_calls = sum(s["rounds"] for s in stats), sum(s["draft_calls"] for s in stats)
    plain = sum(s["plain_steps"] for s in stats)
    tokens = prompts * new
    prefill = prompts * costs["target prefill"]
    base = (prefill + (tokens - prompts) * costs["target decode"]) / tokens
    spec = (
        prefill
        + prompts * costs["draft prefill"]
        + rounds * costs[f"verify {k + 1}"]
        + draft_calls * costs["draft decode"]
        + plain * costs["target decode"]
    ) / tokens
    return {"target_only_us": base, "speculative_us": spec, "tokens_per_round": (tokens - prompts) / max(rounds, 1)}


def measured(artifact: Any, prompts: list[list[int]], new: int, reps: int, **kw: Any) -> float:
    """Process CPU us per token of ``generate`` over the prompts (median of ``reps``), as the bench times it."""
    runs = []
    for _ in range(reps):
        start = time.process_time()
        for prompt in prompts:
            artifact.generate(np.array([prompt]), new, ignore_eos=True, **kw)
        runs.append((time.process_time() - start) * 1e6 / (len(prompts) * new))
    return float(np.median(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-spec-bench"))
    parser.add_argument("--ks", default="2,3,4")
    parser.add_argument("--new", type=int, default=96, help="new tokens per prompt")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--target", default="onnxruntime", help="the artifacts' target: onnxruntime or tvm")
    parser.add_argument("--target-model", type=Path, help="a target model directory (default: the trained pair)")
    parser.add_argument("--draft-model", type=Path, help="its draft's model directory")
    args = parser.parse_args()
    import aotforge

    target_dir, draft_dir, prompts = models(args)
    ks = [int(k) for k in args.ks.split(",")]
    seq = max_seq_len(args)
    target = aotforge.load(build(target_dir, args.work, args.target, "target", max(ks), seq))
    draft = aotforge.load(build(draft_dir, args.work, args.target, "draft", max(ks), seq))
    print(f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    draft_engine = target._with_draft({"draft": draft})["draft"].engine  # a reduced vocabulary's map included
    costs = engine_costs(target._generative().engine, draft_engine, prompts[0], max(ks) + 1, args.reps)
    for name, us in costs.items():
        print(f"{name:15s} {us:8.1f} us CPU per call")
    base = measured(target, prompts, args.new, args.reps)
    print("| k | tokens/round | draft calls/round | target only, us/token (calls alone / measured) "
          "| speculative (calls alone / measured) | speed-up bound | measured |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for k in ks:
        stats = []
        for prompt in prompts:
            target.generate(np.array([prompt]), args.new, draft=draft, num_speculative_tokens=k, ignore_eos=True)
            stats.append(dict(target.speculative_stats))
        b = bound(costs, stats, k, args.new)
        spec = measured(target, prompts, args.new, args.reps, draft=draft, num_speculative_tokens=k)
        calls = sum(s["draft_calls"] for s in stats) / max(sum(s["rounds"] for s in stats), 1)
        print(
            f"| {k} | {b['tokens_per_round']:.2f} | {calls:.2f} | {b['target_only_us']:.1f} / {base:.1f} "
            f"| {b['speculative_us']:.1f} / {spec:.1f} | {b['target_only_us'] / b['speculative_us']:.2f}x "
            f"| {base / spec:.2f}x |"
        )
    print(f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
