"""What a request asks for (:class:`SamplingParams`) and how the engine is sized (:class:`EngineConfig`).

Names follow OpenAI's and vLLM's request fields, so the server maps a request body onto them one to one.
"""

from __future__ import annotations

import dataclasses

from aotforge.core.errors import InputSpecError

#: Seconds in-flight requests may take to finish when the engine shuts down (SIGTERM) before they are aborted.
DRAIN_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings; ``temperature == 0`` is greedy (and ignores top-k / top-p / seed)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    #: stop strings: generation ends before the first one, which the text does not include
    stop: tuple[str, ...] = ()
    #: token ids that end generation besides the model's own end-of-sequence ids (the token is not returned as text)
    stop_token_ids: tuple[int, ...] = ()
    #: keep going past the model's end-of-sequence ids (benchmarks); ``stop_token_ids`` still stop
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InputSpecError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise InputSpecError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise InputSpecError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputSpecError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How many sequences run at once, how many tokens a step takes, and the KV cache's blocks.

    ``max_num_seqs`` 0 runs as many sequences as the artifact's ``max_batch``. ``num_blocks`` 0 sizes the cache
    from ``kv_cache_bytes``, and that 0 from ``max_num_seqs`` full-length sequences. ``max_waiting`` bounds the
    queue: a request past it is refused (the server's 429). ``max_batches_in_flight`` 0 keeps as many batches in
    flight as a pipelined runner takes (one a stage; ``runner.PipelinedRunner``), 1 one batch at a time."""

    max_num_seqs: int = 0
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_blocks: int = 0
    kv_cache_bytes: int = 0
    enable_prefix_caching: bool = True
    max_waiting: int = 256
    max_batches_in_flight: int = 0

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise InputSpecError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_num_seqs", "num_blocks", "kv_cache_bytes", "max_waiting", "max_batches_in_flight"):
            if getattr(self, name) < 0:
                raise InputSpecError(f"{name} must be >= 0, got {getattr(self, name)}")
