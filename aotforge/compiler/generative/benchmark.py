"""The generative benchmark: TTFT per prompt length, inter-token latency, tokens/s, memory.

Timed through ``stream`` (what a serving loop sees, sampling included): TTFT is the wait for the
first token, an inter-token latency each wait after it. Greedy, random prompt ids.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.runtime import offline


@dataclasses.dataclass(frozen=True)
class GenerationBenchOptions:
    prompt_lengths: tuple[int, ...] = (16, 64, 128)
    #: Tokens decoded for the inter-token latency and tokens/s runs.
    decode_tokens: int = 64
    repeats: int = 3
    seed: int = 0


def _timed_stream(runner: Any, ids: np.ndarray, new: int) -> list[float]:
    """Seconds from the call to each step's tokens."""
    marks, start = [], time.perf_counter()
    for _ in offline.stream(runner, ids, new):  # the path load(path).stream() takes
        marks.append(time.perf_counter() - start)
    return marks


def benchmark_generation(
    runner: Any, spec: DecoderSpec, weight_bytes: int, options: GenerationBenchOptions | None = None
) -> dict[str, Any]:
    """The manifest's ``benchmark.generation`` record."""
    opts = options or GenerationBenchOptions()
    rng = np.random.default_rng(opts.seed)
    lengths = [n for n in opts.prompt_lengths if n + 1 <= spec.max_seq_len] or [1]
    prompts = {n: rng.integers(0, spec.vocab, size=(1, n), dtype=np.int64) for n in lengths}
    _timed_stream(runner, prompts[lengths[0]], 2)  # warm-up: first runs allocate and page in weights
    ttft = {
        str(n): _ms(np.median([_timed_stream(runner, p, 1)[0] for _ in range(opts.repeats)]))
        for n, p in prompts.items()
    }
    prompt = prompts[lengths[0]]
    new = max(2, min(opts.decode_tokens, spec.max_seq_len - prompt.shape[1] + 1))
    marks = _timed_stream(runner, prompt, new)
    itl = np.diff(marks) * 1000.0
    per_s = {"1": round((new - 1) / (marks[-1] - marks[0]), 2)}
    if spec.max_batch > 1:
        batch = np.repeat(prompt, spec.max_batch, axis=0)
        wide = _timed_stream(runner, batch, new)
        per_s[str(spec.max_batch)] = round(spec.max_batch * (new - 1) / (wide[-1] - wide[0]), 2)
    return {
        "ttft_ms": ttft,
        "itl_ms": {q: round(float(np.percentile(itl, int(q[1:]))), 3) for q in ("p50", "p90", "p99")},
        "itl_by_position_ms": [round(float(v), 3) for v in itl],
        "itl_prompt_len": int(prompt.shape[1]),
        "tokens_per_s": per_s,
        "kv_cache_bytes": {"1": spec.kv_cache_bytes(1), str(spec.max_batch): spec.kv_cache_bytes(spec.max_batch)},
        "weight_bytes": int(weight_bytes),
        # Peak resident memory of the whole build process, not of the runner alone.
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
    }


def _ms(seconds: float) -> float:
    return round(float(seconds) * 1000.0, 3)
