"""The ranks of a tensor-parallel artifact as one model: a process per rank on this host (or a Ray actor per rank
across hosts: ``ray_ranks.py``), driven in lockstep.

Every call (a prefill, a decode step, a cache copy) goes to all ranks; each runs its rank graph over its
slice of the weights and its heads of the KV cache, the graph's all-reduces meeting in shared memory
(``shm_all_reduce``), and returns its slice of the vocabulary's logits, which are gathered here.
:class:`RankedEngine` is the ``StepEngine`` (``generate``) and its ``model_runner`` the serving runtime's
``ModelRunner``, so ``aotforge generate`` / ``serve`` drive a sharded artifact as they drive any other.

A rank that dies (or fails) sets the all-reduce's abort flag, so the others stop waiting; the call raises
:class:`RankFailedError` naming it. The KV caches went with it, so the group is stopped and a new one started
(``process_group.GroupEngine``) before the error is raised: the serving engine fails every request that had
keys and values in the lost cache, drops its prefix cache, and the next requests run on the new ranks. Only if
the restart fails too does the runner's ``failure`` stay set (the server's health check, and whoever
supervises it, take over: Ray Serve's health check, ``server/replicas.py``; a process manager).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import describe
from aotforge.core.placement import Placement, Workers
from aotforge.core.target_record import TargetRecord
from aotforge.targets import loaded_shard_runtime
from aotforge.targets.generative.process_group import GroupEngine, ProcessGroup
from aotforge.targets.generative.rank_worker import RankWorker
from aotforge.targets.generative.runner import GenerativeRunner
from aotforge.targets.generative.shm_all_reduce import ShmAllReduce, abort_segment, create_segment

#: Floats an all-reduce moves per barrier (larger inputs, e.g. a long prompt's, go in chunks): 4 MiB a rank.
CAPACITY = 1 << 20


def _rank_main(conn: Any, artifact_dir: str, record: dict[str, Any], rank: int, shm_name: str, library: str) -> None:
    """A rank process: load the rank, then serve ``(where, method, args)`` calls until the driver hangs up."""
    tp = record["info"]["tensor_parallel"]
    comm: ShmAllReduce | None = None
    try:
        comm = ShmAllReduce(shm_name, rank, int(tp["degree"]), CAPACITY)
        worker = RankWorker(artifact_dir, record, rank, comm, library)
        conn.send(("ok", None))
    except Exception as e:
        if comm is not None:
            comm.abort()
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


#: What the errors call a rank.
KIND = "tensor-parallel rank"


class RankGroup:
    """The rank processes of one artifact, the pipes to them and their all-reduce segment; or, with
    ``placement.workers`` Ray, the ranks' actors, their all-reduce gloo (``ray_ranks.py``), driven the same way."""

    def __init__(self, artifact_dir: Path, record: TargetRecord, placement: Placement = Placement()) -> None:
        tp = record.info["tensor_parallel"]
        self.degree = int(tp["degree"])
        self.segment: Any = None
        self.workers: Any
        payload = {"name": record.name, "options": record.options, "info": record.info}
        if placement.workers is Workers.RAY:
            from aotforge.targets.generative.ray_ranks import start_rank_actors

            self.collective = "gloo (Ray actors)"
            self.workers = start_rank_actors(KIND, str(artifact_dir), payload, self.degree, placement)
            return
        runtime = loaded_shard_runtime(record.name, "tensor_parallel")
        backend = importlib.import_module(runtime.module)
        library, self.collective = backend.prepare_all_reduce()  # before the segment: nothing to leak if it fails
        self.segment = create_segment(self.degree, CAPACITY)
        args = [(str(artifact_dir), payload, rank, self.segment.name, library) for rank in range(self.degree)]
        try:
            # A rank that fails makes the others stop waiting for it in an all-reduce (the segment's abort flag).
            self.workers = ProcessGroup(KIND, _rank_main, args, runtime.preload, self._abort)
            self.workers.gather()  # each rank says it loaded (and has the segment mapped)
        finally:  # the ranks keep their mappings; no name is left behind, even if this process is killed
            self.segment.unlink()

    @property
    def failed(self) -> str:
        return self.workers.failed

    def _abort(self) -> None:
        abort_segment(self.segment)

    def call(self, where: str, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank's engine (``where="engine"``) or runner; the ranks' results in order.
        Rank actors fail the call at a rank's first error: the others cannot be told to stop waiting (no abort flag
        in gloo), so they are killed."""
        return self.workers.call((where, method, args), stop_at_error=self.segment is None)

    def close(self) -> None:
        self.workers.close()
        if self.segment is not None:
            self.segment.close()


def gather_logits(parts: list[np.ndarray], vocab: int) -> np.ndarray:
    """The ranks' vocabulary slices side by side, the last rank's padding rows cut off."""
    return np.concatenate(parts, axis=-1)[..., :vocab]


class RankedEngine(GroupEngine):
    """The ``StepEngine`` of a tensor-parallel artifact (``GenerativeRunner``'s engine)."""

    def __init__(self, artifact_dir: Path, record: TargetRecord, placement: Placement = Placement()) -> None:
        super().__init__()
        self.artifact_dir, self.record, self.placement = artifact_dir, record, placement
        self.spec = DecoderSpec.from_dict(record.info["decoder"])
        self.verify_width = int(record.info.get("speculative", {}).get("verify_width", 0))
        self.group = self.start_group()

    def start_group(self) -> RankGroup:
        return RankGroup(self.artifact_dir, self.record, self.placement)

    def start(self, batch: int, prompt_len: int) -> None:
        self.call("engine", "start", batch, prompt_len)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        return gather_logits(self.call("engine", "prefill", input_ids, attention_mask, position_ids), self.spec.vocab)

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return gather_logits(self.call("engine", "decode", input_ids, write_pos), self.spec.vocab)

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return gather_logits(self.call("engine", "verify", input_ids, write_pos), self.spec.vocab)

    def verify_positions(self, width: int) -> int:
        return width

    def model_runner(self, max_rows: int) -> RankedModelRunner:
        self.call("new_runner", "", max_rows)
        self.runner_rows = max_rows
        return RankedModelRunner(self, max_rows)


class RankedModelRunner:
    """The serving runtime's ``ModelRunner`` over the ranks' runners: each holds its heads of the KV pool, the
    same block tables in every rank (the engine's), and the driver gathers the vocabulary-split logits."""

    def __init__(self, engine: RankedEngine, max_rows: int) -> None:
        self.engine, self.spec, self.max_rows = engine, engine.spec, max_rows
        self.can_extend = engine.verify_width > 0

    @property
    def failure(self) -> str:
        """Why the ranks cannot serve any more ('' while they can): a server's health check reads it."""
        return self.engine.group.failed

    def _logits(self, method: str, *args: Any) -> np.ndarray:
        return gather_logits(self.engine.call("runner", method, *args), self.spec.vocab)

    def allocate(self, num_blocks: int, block_size: int) -> None:
        self.engine.call("runner", "allocate", num_blocks, block_size)
        self.engine.pool = (num_blocks, block_size)

    def kv_cache_bytes(self) -> int:
        return int(sum(self.engine.call("runner", "kv_cache_bytes")))

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        return self._logits("prefill", token_ids, block_table)

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        return self._logits("extend", token_ids, start, block_table)

    def decode_rows(self, rows: int) -> int:
        return rows

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        return self._logits("decode", token_ids, positions, block_tables)


def load_ranked(artifact_dir: Path, record: TargetRecord, placement: Placement = Placement()) -> GenerativeRunner:
    """A tensor-parallel artifact's runner: its ranks started where ``placement`` says, driven as one model."""
    return GenerativeRunner(RankedEngine(artifact_dir, record, placement))
