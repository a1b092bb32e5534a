"""Which sequences run this step and how many tokens each computes (iteration-level, as vLLM's).

Every step: the running sequences that decode take one token each; sequences still prefilling take a
chunk of their prompt; then waiting requests are admitted first come, first served while
``max_num_seqs``, KV blocks and the step's token budget (``max_num_batched_tokens``) allow, each starting
from the cached blocks of its prompt's longest cached prefix. When a running sequence needs a block the pool
has not got, the most recently admitted one is preempted: its blocks are freed and it waits at the head of
the queue to be recomputed (nothing is lost).

With a pipelined runner several batches are in flight at once: a step then plans at most ``max_seqs`` sequences,
none of them in flight (its next token is not known until its batch returns), and preempts none in flight (the
runner is still writing their blocks), as vLLM's scheduler skips a request whose tokens are still being computed.
"""

from __future__ import annotations

import collections
import dataclasses

from aotforge.runtime.kv_blocks import KVBlockManager
from aotforge.runtime.params import EngineConfig
from aotforge.runtime.sequence import Sequence, Status


@dataclasses.dataclass
class Plan:
    """One step: prompt chunks to compute ``(sequence, tokens)``, then one decode over ``decodes``."""

    prefills: list[tuple[Sequence, int]] = dataclasses.field(default_factory=list)
    decodes: list[Sequence] = dataclasses.field(default_factory=list)
    preempted: list[Sequence] = dataclasses.field(default_factory=list)
    #: prompt tokens admitted this step that the prefix cache was asked for, and of those it held
    prefix_queries: int = 0
    prefix_hits: int = 0


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: KVBlockManager, max_num_seqs: int, can_extend: bool) -> None:
        self.config = config
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.can_extend = can_extend
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []

    def schedule(self, max_seqs: int = 0) -> Plan:
        """This step's plan: at most ``max_seqs`` sequences (0: no limit but ``max_num_seqs``)."""
        plan = Plan()
        budget = self.config.max_num_batched_tokens
        full = (lambda: len(plan.prefills) + len(plan.decodes) >= max_seqs) if max_seqs else (lambda: False)
        for seq in list(self.running):
            if full():
                break
            if seq.status is not Status.RUNNING or seq.in_flight:
                continue  # preempted by an earlier one of this loop, or still in a batch of the runner's
            if seq.prefilling:  # blocks for this step's chunk, allocated once
                n = self._fit(seq, self._chunk(seq, budget, bool(plan.prefills)))
                if n and self._grow(seq, seq.num_computed + n, plan):
                    plan.prefills.append((seq, n))
                    budget -= n
            elif self._grow(seq, seq.num_tokens, plan):
                plan.decodes.append(seq)
                budget -= 1
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0 and not full():
            seq = self.waiting[0]
            if not self._admit(seq, budget, plan):
                break
            self.waiting.popleft()
            budget -= plan.prefills[-1][1]
        return plan

    def _chunk(self, seq: Sequence, budget: int, others: bool) -> int:
        """Tokens of ``seq``'s prompt to compute now: a chunk within the budget (a rest that a whole step holds only
        whole, or first in the step), or (a runner without ``extend``) all of it: within the budget, or alone in
        the step even past it (else a long prompt would never start)."""
        left = seq.num_tokens - seq.num_computed
        if left <= budget or not others:
            return min(left, budget) if self.can_extend else left
        # The rest of a prompt that one step's budget holds is not cut to fill this step's leftover: it waits
        # for the next step whole, since a cut costs an extension (the runners' costlier path per token: a
        # verify graph computes logits at every position) for no token sooner. A longer one is chunked.
        return budget if self.can_extend and left > self.config.max_num_batched_tokens else 0

    def _fit(self, seq: Sequence, n: int) -> int:
        """A chunk of ``n`` tokens cut to what the free blocks hold (a runner with ``extend`` takes any chunk), but
        at least one: a prefilling sequence preempts others for one token, never for a whole chunk."""
        if not n or not self.can_extend:
            return n
        held = len(self.blocks.tables.get(seq.request_id, ()))
        room = (held + self.blocks.num_free) * self.blocks.block_size - seq.num_computed
        return max(1, min(n, room))

    def _admit(self, seq: Sequence, budget: int, plan: Plan) -> bool:
        ids = seq.all_ids
        reuse = self.config.enable_prefix_caching and self.can_extend
        prefix = self.blocks.cached_prefix(ids) if reuse else []
        seq.num_computed = len(prefix) * self.blocks.block_size
        n = self._chunk(seq, budget, bool(plan.prefills))
        if not n or not self.blocks.allocate(seq.request_id, seq.num_computed + n, prefix):
            seq.num_computed = 0
            return False
        seq.status, seq.num_cached = Status.RUNNING, seq.num_computed
        plan.prefix_queries += len(ids) if reuse else 0
        plan.prefix_hits += seq.num_computed
        self.running.append(seq)
        plan.prefills.append((seq, n))
        return True

    def _grow(self, seq: Sequence, positions: int, plan: Plan) -> bool:
        """Blocks for ``positions`` of ``seq``, preempting the newest other running sequences not in flight if the
        pool is short (``seq`` itself last)."""
        while not self.blocks.allocate(seq.request_id, positions):
            victim = next(s for s in reversed(self.running) if not s.in_flight)
            self.preempt(victim)
            plan.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def schedulable(self) -> bool:
        """Whether a plan now could hold anything: a running sequence not in flight, or a request to admit."""
        idle = any(not seq.in_flight for seq in self.running)
        return idle or bool(self.waiting and len(self.running) < self.max_num_seqs)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.request_id)
        seq.status, seq.num_computed = Status.WAITING, 0
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Take ``seq`` out (finished or aborted): its blocks back to the pool, its full ones still cached for a
        later prompt with the same prefix."""
        if seq in self.running:
            self.running.remove(seq)
            self.blocks.free(seq.request_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
