"""The stages of a pipeline-parallel artifact as one model: a process per stage on this host (or a Ray actor per
stage across hosts: ``ray_stages.py``), micro-batches in flight.

Every call goes to all stages at once; stage ``s`` runs its layers and hands the hidden states to stage ``s+1``
over a pipe from inside its graph (``targets/onnxruntime/pipeline_parallel.py``), so the stages pipeline by
themselves: while stage ``s + 1`` runs micro-batch ``k``, stage ``s`` runs ``k + 1``. A serving decode of ``b``
sequences goes as ``min(b, micro_batches)`` micro-batches; the last stage returns the logits.
:class:`StagedEngine` is the ``StepEngine`` (``generate``) and its ``model_runner`` the serving runtime's
``ModelRunner``, so ``aotforge generate`` / ``serve`` drive a staged artifact as they drive any other.

A stage that dies or fails stops the whole group (a stage waiting on its neighbour would otherwise wait
forever): the call raises :class:`RankFailedError` naming it, after a new group was started with an empty KV
cache, as for tensor-parallel ranks (``process_group.GroupEngine``).
"""

from __future__ import annotations

import collections
import multiprocessing
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import RankFailedError, describe
from aotforge.core.placement import Placement, Workers
from aotforge.core.target_record import TargetRecord
from aotforge.targets import loaded_shard_runtime
from aotforge.targets.generative.process_group import GroupEngine, ProcessGroup
from aotforge.targets.generative.runner import GenerativeRunner
from aotforge.targets.generative.stage_worker import StageWorker, logits_shape

#: What the errors call a stage.
KIND = "pipeline-parallel stage"


def _stage_main(
    conn: Any, artifact_dir: str, record: dict[str, Any], stage: int, recv: Any, send: Any, logits: str = ""
) -> None:
    """A stage process: load the stage, then serve ``(where, method, args)`` calls until the driver hangs up."""
    try:
        worker = StageWorker(artifact_dir, record, stage, recv, send, logits)
        conn.send(("ok", None))
    except Exception as e:
        conn.send(("error", describe(e, last=True)))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(worker.handle(*message))
        except OSError:  # the driver is gone (it stops the group on a failure)
            return


class StageGroup:
    """The stage processes of one artifact, the pipes from the driver to each, and between neighbours; or, with
    ``placement.workers`` Ray, the stages' actors (``ray_stages.py``), driven the same way.

    On one host the last stage writes a serving step's decode logits into :attr:`logits`, a shared segment of
    ``[slots, max_batch, vocab]`` (``stage_worker.logits_shape``), rather than sending them back over its pipe."""

    def __init__(self, artifact_dir: Path, record: TargetRecord, placement: Placement = Placement()) -> None:
        pp = record.info["pipeline_parallel"]
        self.degree = int(pp["degree"])
        runtime = loaded_shard_runtime(record.name, "pipeline_parallel")
        payload = {"name": record.name, "options": record.options, "info": record.info}
        self.workers: Any
        self.logits: np.ndarray | None = None
        self._segment: shared_memory.SharedMemory | None = None
        if placement.workers is Workers.RAY:
            from aotforge.targets.generative.ray_stages import start_stage_actors

            self.workers = start_stage_actors(KIND, str(artifact_dir), payload, self.degree, placement)
            return
        links = [multiprocessing.Pipe(duplex=False) for _ in range(self.degree - 1)]  # (s+1 reads, s writes)
        shape = logits_shape(payload)
        segment = shared_memory.SharedMemory(create=True, size=4 * shape[0] * shape[1] * shape[2])
        args = [
            (
                str(artifact_dir), payload, stage,
                links[stage - 1][0] if stage > 0 else None,
                links[stage][1] if stage < self.degree - 1 else None,
                segment.name,
            )
            for stage in range(self.degree)
        ]  # fmt: skip
        try:
            self.workers = ProcessGroup(KIND, _stage_main, args, runtime.preload)
            for reader, writer in links:  # the stages hold them now: a dead stage's neighbour sees its pipe close
                reader.close()
                writer.close()
            self.workers.gather(stop_at_error=True)
        finally:  # the last stage keeps its mapping, this process its own: no name is left behind, even if killed
            segment.unlink()
        self._segment = segment
        self.logits = np.ndarray(shape, dtype=np.float32, buffer=segment.buf)

    @property
    def failed(self) -> str:
        return self.workers.failed

    def call(self, where: str, method: str, *args: Any) -> Any:
        """``method(*args)`` on every stage's engine (``where="engine"``) or runner; the last stage's result."""
        self.submit(where, method, *args)
        return self.collect()

    def submit(self, where: str, method: str, *args: Any) -> None:
        """Send :meth:`call`'s message to every stage without waiting: each stage runs its calls in order, so a
        stage works on the next call while the one after it works on this one. The last stage is told first: it is
        the one the others feed."""
        self.workers.send((where, method, args), range(self.degree - 1, -1, -1))

    def collect(self) -> Any:
        """The last stage's result of the oldest call submitted."""
        return self.workers.gather(stop_at_error=True)[-1]

    def busy_seconds(self) -> list[float]:
        """Each stage's seconds computing so far (not waiting on a neighbour): the bubble is the rest."""
        return [float(b) for b in self.call_each("busy", "")]

    def call_each(self, where: str, method: str) -> list[Any]:
        """``method()`` on every stage's runner (``where="each"``), or its busy seconds; every stage's result."""
        return self.workers.call((where, method, ()), stop_at_error=True)

    def close(self) -> None:
        self.workers.close()
        if self._segment is not None:
            self.logits = None
            try:
                self._segment.close()
            except BufferError:  # a caller still holds a view of it: the mapping goes with the last one
                pass
            self._segment = None


class StagedEngine(GroupEngine):
    """The ``StepEngine`` of a pipeline-parallel artifact (``GenerativeRunner``'s engine)."""

    def __init__(self, artifact_dir: Path, record: TargetRecord, placement: Placement = Placement()) -> None:
        super().__init__()
        self.artifact_dir, self.record, self.placement = artifact_dir, record, placement
        self.spec = DecoderSpec.from_dict(record.info["decoder"])
        self.verify_width = int(record.info.get("speculative", {}).get("verify_width", 0))
        self.micro_batches = int(record.info["pipeline_parallel"]["micro_batches"])
        self.group = self.start_group()

    def start_group(self) -> StageGroup:
        return StageGroup(self.artifact_dir, self.record, self.placement)

    def start(self, batch: int, prompt_len: int) -> None:
        self.call("engine", "start", batch, prompt_len)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        return self.call("engine", "prefill", input_ids, attention_mask, position_ids)

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return self.call("engine", "decode", input_ids, write_pos)

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return self.call("engine", "verify", input_ids, write_pos)

    def verify_positions(self, width: int) -> int:
        return width

    def model_runner(self, max_rows: int) -> StagedModelRunner:
        self.call("new_runner", "", max_rows)
        self.runner_rows = max_rows
        return StagedModelRunner(self, max_rows)


class StagedModelRunner:
    """The serving runtime's ``ModelRunner`` over the stages' runners: each holds the KV pool of its layers under
    the same block tables (the engine's); a decode goes through the stages as micro-batches.

    It is a ``PipelinedRunner`` (``runtime/runner.py``) of one batch in flight a stage: :meth:`submit` sends a step
    to every stage and returns, so while the last stage runs one batch the first runs the next. Each batch in
    flight decodes on working rows of its own (``slot``), so the groups of sequences that alternate keep theirs."""

    def __init__(self, engine: StagedEngine, max_rows: int) -> None:
        self.engine, self.spec, self.max_rows = engine, engine.spec, max_rows
        self.can_extend = engine.verify_width > 0
        self.batches_in_flight = engine.group.degree
        #: the working-row slot of each step submitted and not yet collected, oldest first
        self._slots: collections.deque[int] = collections.deque()
        #: steps submitted, and of those how many while another was in flight (the stages overlapped them)
        self.submitted = self.overlapped = 0
        self.peak_in_flight = 0

    @property
    def failure(self) -> str:
        """Why the stages cannot serve any more ('' while they can): a server's health check reads it."""
        return self.engine.group.failed

    def _call(self, where: str, method: str, *args: Any) -> Any:
        """A call that waits for its result, once every step in flight has come back (and been dropped: a caller
        that calls now has given up on them, e.g. a ``generate()`` whose rows all stopped)."""
        while self._slots:
            self.collect()
        return self.engine.call(where, method, *args)

    def allocate(self, num_blocks: int, block_size: int) -> None:
        self._call("runner", "allocate", num_blocks, block_size)
        self.engine.pool = (num_blocks, block_size)

    def kv_cache_bytes(self) -> int:
        while self._slots:
            self.collect()
        return int(sum(self.engine.group.call_each("each", "kv_cache_bytes")))

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        return self._call("runner", "prefill", token_ids, block_table)

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        return self._call("runner", "extend", token_ids, start, block_table)

    def decode_rows(self, rows: int) -> int:
        return rows

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        parts = min(len(token_ids), self.engine.micro_batches)
        return self._call("runner", "decode", token_ids, positions, block_tables, parts)

    def step(
        self, chunks: list[tuple[np.ndarray, int, np.ndarray]], decode: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        """A step's prompt chunks and decode as one call (``runtime/runner.py``): each prompt is one more item in
        the decode's fill and drain of the stages, so it waits for the stages once a step, not once a prompt."""
        parts = min(len(decode[0]), self.engine.micro_batches) if decode is not None else 0
        return self._call("runner", "step", chunks, decode, parts)

    def submit(
        self, chunks: list[tuple[np.ndarray, int, np.ndarray]], decode: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    ) -> None:
        """:meth:`step` without waiting: its decode as one micro-batch (the other batches in flight fill the
        stages), on the rows of the lowest slot no batch in flight holds."""
        slot = min(set(range(self.batches_in_flight + 1)) - set(self._slots))
        first = 0
        if decode is not None:
            share = -(-self.max_rows // self.batches_in_flight)
            first = max(0, min(slot * share, self.max_rows - len(decode[0])))
        logits = self.engine.group.logits
        shared = logits is not None and slot < len(logits) and (decode is None or len(decode[0]) <= logits.shape[1])
        try:
            if shared:  # the decode logits come back through the group's shared segment, in this slot
                self.engine.submit("shared", "step", slot, chunks, decode, 1, first)
            else:
                self.engine.submit("runner", "step", chunks, decode, 1, first)
        except RankFailedError:
            self._slots.clear()  # the restarted stages hold none of them
            raise
        self.submitted += 1
        self.overlapped += bool(self._slots)
        self._slots.append(slot)
        self.peak_in_flight = max(self.peak_in_flight, len(self._slots))

    def collect(self) -> tuple[list[np.ndarray], np.ndarray | None]:
        """The oldest submitted step's ``(chunk_logits, decode_logits)``."""
        slot = self._slots.popleft()
        try:
            prompts, logits = self.engine.collect()
        except RankFailedError:
            self._slots.clear()
            raise
        if isinstance(logits, int):  # rows in the shared segment's slot, which the next submit may reuse: copied
            logits = self.engine.group.logits[slot, :logits].copy()
        return prompts, logits


def load_staged(artifact_dir: Path, record: TargetRecord, placement: Placement = Placement()) -> GenerativeRunner:
    """A pipeline-parallel artifact's runner: its stages started where ``placement`` says, driven as one model."""
    return GenerativeRunner(StagedEngine(artifact_dir, record, placement))
