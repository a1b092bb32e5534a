"""The batches a pipelined runner holds at once (vLLM's engine-core batch queue): which may go in, how large each is,
and which comes back next.

Over a :class:`~aotforge.runtime.runner.PipelinedRunner` (stages that each work on a different step) the engine keeps
``depth`` batches of disjoint sequences in flight: a step first submits a new batch while the queue has room and
something is left to plan, else it waits for the oldest batch and returns its tokens. Running sequences so fall into
as many groups as batches, each stepped in turn, and stage 0 runs one group while stage 1 runs the other. A sequence
in a batch in flight is marked (``Sequence.in_flight``): the scheduler neither plans nor preempts it until its batch
is back.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from aotforge.runtime.runner import PipelinedRunner
from aotforge.runtime.scheduler import Plan, Scheduler
from aotforge.runtime.sequence import Sequence

#: what a runner's ``step`` and ``collect`` return: each prompt chunk's last logits, then the decode's (or None)
StepLogits = tuple[list[np.ndarray], np.ndarray | None]


def planned(plan: Plan) -> list[Sequence]:
    """The sequences a plan computes: its prompt chunks', then its decode's."""
    return [seq for seq, _ in plan.prefills] + plan.decodes


class BatchQueue:
    """The plans submitted to a pipelined runner and not yet collected, oldest first, at most ``depth`` of them
    (the runner's ``batches_in_flight``, capped by ``EngineConfig.max_batches_in_flight`` where that is set)."""

    def __init__(self, runner: PipelinedRunner, scheduler: Scheduler, max_batches: int = 0) -> None:
        self.runner, self.scheduler = runner, scheduler
        depth = int(runner.batches_in_flight)
        self.depth = max(1, min(depth, max_batches or depth))
        self._plans: collections.deque[Plan] = collections.deque()

    def __len__(self) -> int:
        return len(self._plans)

    def has_room(self) -> bool:
        return len(self._plans) < self.depth

    def wants_more(self) -> bool:
        """Whether another batch should go in before the oldest is waited for: filling the pipeline comes first."""
        return self.has_room() and self.scheduler.schedulable()

    def batch_seqs(self) -> int:
        """How many sequences a batch takes: an even share of what may run, so the batches in flight are alike."""
        s = self.scheduler
        runnable = min(s.max_num_seqs, len(s.running) + len(s.waiting))
        return max(1, -(-runnable // self.depth))

    def submit(self, plan: Plan, chunks: list[tuple[np.ndarray, int, np.ndarray]], decode: Any) -> None:
        """Send ``plan``'s step (as ``PipelinedRunner.step`` takes it) and hold it; the runner's error propagates
        with nothing held."""
        self.runner.submit(chunks, decode)
        for seq in planned(plan):
            seq.in_flight = True
        self._plans.append(plan)

    def oldest(self) -> Plan:
        """The oldest plan, no longer held: its results are the runner's next ``collect()``."""
        plan = self._plans.popleft()
        for seq in planned(plan):
            seq.in_flight = False
        return plan

    def collect(self) -> StepLogits:
        return self.runner.collect()

    def clear(self) -> None:
        """Forget every plan held (the runner restarted and holds none of them)."""
        self._plans.clear()
