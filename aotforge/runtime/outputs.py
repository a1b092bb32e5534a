"""What the engine hands its clients: each request's new tokens and text, and each step's statistics."""

from __future__ import annotations

import dataclasses
import enum


class FinishReason(enum.StrEnum):
    """OpenAI's ``finish_reason`` values, and the two ends a server adds (a client gone, a runner fault)."""

    STOP = "stop"  # an end-of-sequence token, a stop token id or a stop string
    LENGTH = "length"  # max_tokens, or the end of the model's context
    ABORT = "abort"  # the client went away or the server shut down
    ERROR = "error"  # the model runner failed on a step this request was in


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """One update of a request: the tokens and text added since the last one (``text`` never splits a
    UTF-8 character and holds back what may still become a stop string)."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    #: prompt tokens whose KV came from the prefix cache
    cached_tokens: int = 0
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class FinishedRequestStats:
    finish_reason: FinishReason
    prompt_tokens: int
    generation_tokens: int
    e2e_latency_s: float
    queue_time_s: float
    prefill_time_s: float
    decode_time_s: float


@dataclasses.dataclass
class StepStats:
    """What one engine step did (the metrics listener turns it into counters and histograms)."""

    num_running: int = 0
    num_waiting: int = 0
    #: fraction of the KV cache's blocks held by sequences (cached free blocks are not held)
    kv_cache_usage: float = 0.0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    num_preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    time_to_first_tokens_s: list[float] = dataclasses.field(default_factory=list)
    inter_token_latencies_s: list[float] = dataclasses.field(default_factory=list)
    finished: list[FinishedRequestStats] = dataclasses.field(default_factory=list)
