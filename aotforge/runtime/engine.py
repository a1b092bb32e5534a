"""The engine: a step loop over a model runner, the scheduler and the KV blocks (one path for every client).

``add_request`` queues a prompt; each ``step`` runs what the scheduler planned (prompt chunks, then one
decode over every decoding sequence), samples each sequence's next token with its own parameters, and
returns what changed as :class:`RequestOutput`s. Not thread-safe: ``AsyncEngine`` drives it from one thread.

Over a pipelined runner (``runner.PipelinedRunner``: stages that each work on a different step) the engine keeps
``batches_in_flight`` batches of disjoint sequences in flight through its batch queue (``batch_queue.py``), and a
step of one batch is the runner's ``step``: its prompt chunks and decode in one call.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np

from aotforge.core.errors import InputSpecError, RankFailedError, describe
from aotforge.runtime.batch_queue import BatchQueue, StepLogits, planned
from aotforge.runtime.detokenizer import Detokenizer
from aotforge.runtime.kv_blocks import SCRATCH_BLOCK, KVBlockManager
from aotforge.runtime.outputs import FinishReason, RequestOutput, StepStats
from aotforge.runtime.params import EngineConfig, SamplingParams
from aotforge.runtime.runner import ModelRunner, PipelinedRunner
from aotforge.runtime.scheduler import Plan, Scheduler
from aotforge.runtime.sequence import Sequence, Status
from aotforge.runtime.step_inputs import StepInputs
from aotforge.targets.generative.sampling import Sampler


def kv_block_bytes(runner: ModelRunner, block_size: int) -> int:
    spec = runner.spec
    return 2 * spec.layers * spec.kv_heads * spec.head_dim * 4 * block_size


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig | None = None,
        tokenizer: Any | None = None,
        eos_token_ids: Seq[int] = (),
    ) -> None:
        self.config = config = config or EngineConfig()
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.max_model_len = runner.spec.max_seq_len
        slot_blocks = -(-self.max_model_len // config.block_size)
        num_blocks = config.num_blocks or (
            config.kv_cache_bytes // kv_block_bytes(runner, config.block_size)
            if config.kv_cache_bytes
            else self._max_num_seqs(runner) * slot_blocks
        )
        if num_blocks < slot_blocks:
            raise InputSpecError(
                f"a KV cache of {num_blocks} blocks of {config.block_size} tokens cannot hold one sequence of the "
                f"model's {self.max_model_len} positions ({slot_blocks} blocks): give more --num-blocks / "
                "--kv-cache-bytes"
            )
        self.blocks = KVBlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        runner.allocate(num_blocks + 1, config.block_size)  # and the scratch block
        self.inputs = StepInputs(runner, self.blocks, slot_blocks)
        self.scheduler = Scheduler(config, self.blocks, self._max_num_seqs(runner), runner.can_extend)
        self._sequences: dict[str, Sequence] = {}
        self._stats = StepStats()
        self.last_stats = StepStats(kv_blocks_total=num_blocks)
        #: a runner whose stages each work on a different step; None: each step runs to its end in one call
        self.pipelined = runner if isinstance(runner, PipelinedRunner) else None
        #: the batches submitted to a pipelined runner and not yet collected
        self._queue = (
            BatchQueue(self.pipelined, self.scheduler, config.max_batches_in_flight) if self.pipelined else None
        )

    def _max_num_seqs(self, runner: ModelRunner) -> int:
        return min(self.config.max_num_seqs or runner.max_rows, runner.max_rows)

    def warmup(self) -> None:
        """Run every decode width, a prompt and (if the runner has it) an extension once, before any request:
        ONNX Runtime plans each new input shape on its first run, which would land on the first requests' latency.
        Every table is all scratch block, so what this writes is never read."""
        width = self.inputs.table_width
        widths = sorted({self.runner.decode_rows(n) for n in range(1, self.scheduler.max_num_seqs + 1)})
        for rows in widths:
            zeros = np.zeros(rows, dtype=np.int64)
            self.runner.decode(zeros, zeros, np.full((rows, width), SCRATCH_BLOCK, dtype=np.int64))
        table = np.full(width, SCRATCH_BLOCK, dtype=np.int64)
        self.runner.prefill(np.zeros(min(16, self.max_model_len), dtype=np.int64), table)
        if self.runner.can_extend and self.max_model_len > 20:
            self.runner.extend(np.zeros(4, dtype=np.int64), 16, table)

    # -- requests ------------------------------------------------------------------------------------------

    def check_request(self, prompt_ids: Seq[int], params: SamplingParams) -> None:
        """Refuse, before it queues, a request the model's context cannot hold."""
        if not prompt_ids:
            raise InputSpecError("the prompt is empty: give at least one token")
        vocab = self.runner.spec.vocab
        bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
        if bad:
            raise InputSpecError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        # The last new token is only sampled, never written: prompt + max_tokens - 1 positions.
        if len(prompt_ids) + params.max_tokens - 1 > self.max_model_len:
            raise InputSpecError(
                f"this model's context is {self.max_model_len} tokens; the prompt has {len(prompt_ids)} and "
                f"max_tokens is {params.max_tokens} ({len(prompt_ids) + params.max_tokens - 1} positions): shorten "
                f"the prompt or ask for at most {max(self.max_model_len - len(prompt_ids) + 1, 0)} tokens"
            )

    def add_request(
        self, request_id: str, prompt_ids: Seq[int], params: SamplingParams, sampler: Sampler | None = None
    ) -> None:
        """Queue a request. ``sampler`` (default: one of its own, from ``params``) may be shared by several requests:
        ``generate()``'s batch draws from one generator, row after row, as it always has."""
        if request_id in self._sequences:
            raise InputSpecError(f"request id {request_id!r} is already in use")
        self.check_request(prompt_ids, params)
        detokenizer = Detokenizer(self.tokenizer, params.stop)
        seq = Sequence(request_id, [int(t) for t in prompt_ids], params, detokenizer, shared_sampler=sampler)
        self._sequences[request_id] = seq
        self.scheduler.waiting.append(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self._sequences.get(request_id)
        if seq is None or seq.finished:
            return None
        return self._finish(seq, FinishReason.ABORT)

    @property
    def batches_in_flight(self) -> int:
        """Batches the runner may hold at once (1: each step runs to its end before the next is planned)."""
        return self._queue.depth if self._queue is not None else 1

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running or self._queue)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # -- the step ------------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self._queue is not None and self._queue.depth > 1:
            outputs = self._step_pipelined(self._queue)
        elif self.pipelined is not None:  # one batch in flight: the step's prompts pipeline with its decode
            outputs = self._run_step(self.pipelined, self._schedule())
        else:
            outputs = self._step_plain(self._schedule())
        self._finish_stats()
        return outputs

    def _step_plain(self, plan: Plan) -> list[RequestOutput]:
        """Each prompt chunk in its own call (a failure there is that request's alone), then the decode."""
        outputs: list[RequestOutput] = []
        for seq, n in plan.prefills:
            if not seq.finished:  # a lost KV cache (below) ends the step's other sequences too
                outputs += self._outputs(Plan(prefills=[(seq, n)]), functools.partial(self._prefill, seq, n))
        decodes = Plan(decodes=[seq for seq in plan.decodes if not seq.finished])
        if decodes.decodes:
            outputs += self._outputs(decodes, lambda: ([], self.runner.decode(*self.inputs.decode(decodes))))
        return outputs

    def _prefill(self, seq: Sequence, n: int) -> StepLogits:
        tokens, start, table = self.inputs.chunk(seq, n)
        return [self.runner.prefill(tokens, table) if start == 0 else self.runner.extend(tokens, start, table)], None

    def _schedule(self, max_seqs: int = 0) -> Plan:
        plan = self.scheduler.schedule(max_seqs)
        self._stats.num_preemptions += len(plan.preempted)
        self._stats.prefix_cache_queries += plan.prefix_queries
        self._stats.prefix_cache_hits += plan.prefix_hits
        now = time.monotonic()
        for seq, _ in plan.prefills:
            if seq.scheduled_at is None:
                seq.scheduled_at = now
        return plan

    def _step_pipelined(self, queue: BatchQueue) -> list[RequestOutput]:
        """Submit a new batch while the queue has room for one and something is left to plan (filling the
        pipeline comes first); else wait for the oldest batch and take its tokens."""
        if queue.has_room():
            plan = self._schedule(queue.batch_seqs())
            if plan.prefills or plan.decodes:
                try:
                    queue.submit(plan, *self.inputs.step(plan))
                except RankFailedError as e:
                    return self._lost_cache(e)
                except Exception as e:
                    return self._failed(plan, e)
                if queue.wants_more():
                    return []
        if not queue:
            return []
        return self._outputs(queue.oldest(), queue.collect)

    def _run_step(self, runner: PipelinedRunner, plan: Plan) -> list[RequestOutput]:
        """The step's prompt chunks and its decode as one call of the runner's ``step`` (``runner.py``)."""
        if not (plan.prefills or plan.decodes):
            return []
        chunks, decode = self.inputs.step(plan)
        return self._outputs(plan, lambda: runner.step(chunks, decode))

    def _outputs(self, plan: Plan, call: Callable[[], StepLogits]) -> list[RequestOutput]:
        """``call`` (the runner's work on ``plan``: a prompt chunk, a decode, or a pipelined ``step`` / ``collect``) and
        what its logits make. A failure fails the plan's sequences, or every sequence in the pool where a rank died.
        A sequence aborted while its batch was in flight is finished already: what the batch made for it goes."""
        try:
            prompt_logits, logits = call()
        except RankFailedError as e:
            return self._lost_cache(e)
        except Exception as e:
            return self._failed(plan, e)
        outputs = []
        for (seq, n), last in zip(plan.prefills, prompt_logits, strict=True):
            outputs += [] if seq.finished else self._prefilled(seq, n, last)
        if plan.decodes:
            assert logits is not None, "a runner returned no logits for a step with a decode"
            outputs += self._decoded(plan, logits)
        return outputs

    def _failed(self, plan: Plan, e: Exception) -> list[RequestOutput]:
        """The call's sequences fail together: the call cannot say whose fault it was."""
        why = f"the model runner failed: {describe(e, last=True)}"
        return [self._finish(seq, FinishReason.ERROR, why) for seq in planned(plan) if not seq.finished]

    def _computed(self, seq: Sequence, n: int) -> None:
        """``n`` more positions of ``seq`` hold their keys and values: its newly full blocks join the cache."""
        seq.num_computed += n
        self.blocks.cache_full_blocks(seq.request_id, seq.all_ids[: seq.num_computed])

    def _prefilled(self, seq: Sequence, n: int, logits: np.ndarray) -> list[RequestOutput]:
        self._computed(seq, n)
        self._stats.prompt_tokens += n
        if seq.num_computed < seq.num_tokens:
            return []  # more chunks to come
        return [self._append(seq, logits)]

    def _decoded(self, plan: Plan, logits: np.ndarray) -> list[RequestOutput]:
        outputs = []
        for row, seq in enumerate(plan.decodes):
            if seq.finished:  # aborted while its batch was in flight
                continue
            self._computed(seq, 1)
            outputs.append(self._append(seq, logits[row]))
        return outputs

    def _lost_cache(self, e: RankFailedError) -> list[RequestOutput]:
        """A rank or stage of a sharded runner died, and its KV cache with it (the runner restarts it empty):
        every sequence with keys and values in the pool fails, and the prefix cache forgets what it held."""
        why = f"the model runner failed: {describe(e, last=True)}"
        outputs = [self._finish(seq, FinishReason.ERROR, why) for seq in list(self.scheduler.running)]
        if self._queue is not None:
            self._queue.clear()  # the runner's restarted stages hold none of them
        self.blocks.drop_cached()
        return outputs

    def _append(self, seq: Sequence, logits: np.ndarray) -> RequestOutput:
        token = int(seq.sampler(logits[None, :])[0])
        now = time.monotonic()
        if seq.first_token_at is None:
            seq.first_token_at = now
            self._stats.time_to_first_tokens_s.append(now - seq.arrival)
        elif seq.last_token_at is not None:
            self._stats.inter_token_latencies_s.append(now - seq.last_token_at)
        seq.last_token_at = now
        seq.output_ids.append(token)
        self._stats.generation_tokens += 1
        p = seq.params
        stop_token = token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)
        if not stop_token:
            seq.detokenizer.add(token)
        if stop_token or seq.detokenizer.find_stop() >= 0:
            return self._finish(seq, FinishReason.STOP, new=(token,))
        if len(seq.output_ids) >= p.max_tokens:
            return self._finish(seq, FinishReason.LENGTH, new=(token,))
        return self._output(seq, (token,), seq.detokenizer.take(final=False))

    def _finish(
        self, seq: Sequence, reason: FinishReason, error: str | None = None, new: tuple[int, ...] = ()
    ) -> RequestOutput:
        was_running = seq.status is Status.RUNNING
        self.scheduler.finish(seq)
        seq.finish_reason, seq.error = reason, error
        del self._sequences[seq.request_id]
        self._stats.finished.append(seq.stats(reason, was_running, time.monotonic()))
        return self._output(seq, new, seq.detokenizer.take(final=True))

    def _output(self, seq: Sequence, new: tuple[int, ...], text: str) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            token_ids=new,
            text=text,
            finished=seq.finished,
            finish_reason=seq.finish_reason,
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_tokens=seq.num_cached,
            error=seq.error,
        )

    def _finish_stats(self) -> None:
        s = self._stats
        s.num_running, s.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        s.kv_blocks_used, s.kv_blocks_total = self.blocks.num_used, self.blocks.num_blocks
        s.kv_cache_usage = self.blocks.usage()
        self.last_stats, self._stats = s, StepStats()
