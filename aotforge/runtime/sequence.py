"""One request as the engine tracks it: its tokens so far, where its KV lives, and its timings."""

from __future__ import annotations

import dataclasses
import enum
import time

from aotforge.runtime.detokenizer import Detokenizer
from aotforge.runtime.outputs import FinishedRequestStats, FinishReason
from aotforge.runtime.params import SamplingParams
from aotforge.targets.generative.sampling import Sampler, SamplingOptions


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: Detokenizer
    arrival: float = dataclasses.field(default_factory=time.monotonic)
    output_ids: list[int] = dataclasses.field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    #: positions whose KV the cache holds (prompt tokens prefilled, then one per decoded token)
    num_computed: int = 0
    #: prompt tokens whose KV came from the prefix cache
    num_cached: int = 0
    #: in a batch the runner has not returned yet (a pipelined runner): its next token is not known
    in_flight: bool = False
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    sampler: Sampler = dataclasses.field(init=False)
    #: a sampler several requests share; None: one of its own, from ``params``
    shared_sampler: dataclasses.InitVar[Sampler | None] = None

    def __post_init__(self, shared_sampler: Sampler | None) -> None:
        p = self.params
        options = SamplingOptions(not p.greedy, p.temperature or 1.0, p.top_k, p.top_p, p.seed)
        self.sampler = shared_sampler if shared_sampler is not None else Sampler(options)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        """True until the prompt (after a preemption: the prompt and the output so far) has its KV; then each
        step computes the one token sampled last."""
        return self.num_computed < self.num_tokens - 1 or (not self.output_ids and self.num_computed < self.num_tokens)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def stats(self, reason: FinishReason, was_running: bool, now: float) -> FinishedRequestStats:
        """What the metrics record of this request as it ends at ``now`` (``was_running``: it had been scheduled)."""
        start = self.scheduled_at if self.scheduled_at is not None else now
        first = self.first_token_at if self.first_token_at is not None else now
        return FinishedRequestStats(
            finish_reason=reason,
            prompt_tokens=len(self.prompt_ids),
            generation_tokens=len(self.output_ids),
            e2e_latency_s=now - self.arrival,
            queue_time_s=start - self.arrival,
            prefill_time_s=first - start if was_running or self.first_token_at else 0.0,
            decode_time_s=now - first,
        )
