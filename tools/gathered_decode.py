"""Two tensor-parallel ranks that decode together without a driver: each gathers the logits over the ranks'
collectives (what a driver on the first host does with the second host's slice of the vocabulary), so every rank
picks the same greedy token. ``tools/bench_collectives.py`` runs one such rank in each of two network namespaces.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np


class GatheredEngine:
    """A rank's step engine whose logits are every rank's vocabulary slices, gathered over ``comm``."""

    def __init__(self, engine: Any, comm: Any, spec: Any) -> None:
        self.engine, self.comm, self.spec = engine, comm, spec

    def _gather(self, part: np.ndarray) -> np.ndarray:
        rows = part.reshape(-1, 1, part.shape[-1])
        whole = self.comm.all_gather(rows, self.comm.world)  # [rows, rank, slice]: the slices side by side
        return whole.reshape(*part.shape[:-1], -1)[..., : self.spec.vocab]

    def start(self, batch: int, prompt_len: int) -> None:
        self.engine.start(batch, prompt_len)

    def prefill(self, *args: np.ndarray) -> np.ndarray:
        return self._gather(self.engine.prefill(*args))

    def decode(self, *args: np.ndarray) -> np.ndarray:
        return self._gather(self.engine.decode(*args))


def decode(artifact: Path, rank: int, comm: Any, prompt: int, new: int) -> dict[str, Any]:
    """Rank ``rank`` of ``artifact`` over ``comm``: ``new`` greedy tokens after a ``prompt``-token prompt (after a
    warm-up) and their inter-token latency."""
    from aotforge.artifacts.manifest import read_manifest
    from aotforge.core.decoder import DecoderSpec
    from aotforge.targets.generative.decoding import stream_tokens
    from aotforge.targets.generative.rank_worker import RankWorker

    record = read_manifest(artifact).target
    payload = {"name": record.name, "options": record.options, "info": record.info}
    worker = RankWorker(str(artifact), payload, rank, comm, library="")
    engine = GatheredEngine(worker.engine, comm, DecoderSpec.from_dict(record.info["decoder"]))
    ids = np.arange(100, 100 + prompt, dtype=np.int64)[None, :]
    list(stream_tokens(engine, ids, 4))  # warm-up
    stamps, tokens = [], []
    for step in stream_tokens(engine, ids, new):
        stamps.append(time.perf_counter())
        tokens.append(int(step[0]))
    gaps = np.diff(stamps) * 1e3
    return {"itl_ms": float(np.median(gaps)), "p90_itl_ms": float(np.percentile(gaps, 90)), "tokens": tokens}
