"""The ranks of a tensor-parallel artifact as one model: a process per rank on this host, driven in lockstep.

Every call (a prefill, a decode step, a cache copy) goes to all ranks; each runs its rank graph over its
slice of the weights and its heads of the KV cache, the graph's all-reduces meeting in shared memory
(``shm_all_reduce``), and returns its slice of the vocabulary's logits, which are gathered here.
:class:`RankedEngine` is the ``StepEngine`` (``generate``) and its ``model_runner`` the serving runtime's
``ModelRunner``, so ``aotforge generate`` / ``serve`` drive a sharded artifact as they drive any other.

A rank that dies (or fails) sets the all-reduce's abort flag, so the others stop waiting; the call raises
:class:`RankFailedError` naming it, and so does every later call: the KV caches went with it, so the group
cannot go on. The server's health check then fails, and whoever supervises the server (Ray Serve's
health check, ``server/replicas.py``; a process manager) restarts it.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.connection
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import RankFailedError, describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets.generative.runner import GenerativeRunner
from aotforge.targets.generative.shm_all_reduce import ShmAllReduce, abort_segment, create_segment

#: Target -> module with ``prepare_all_reduce()``, ``register_all_reduce(comm, library)`` and
#: ``load_rank(rank_dir, record, spec, library)``.
RANK_BACKENDS = {"onnxruntime": "aotforge.targets.onnxruntime.tensor_parallel"}
#: Target -> what its ranks import, imported once by the process the ranks are forked from.
RANK_PRELOAD = {"onnxruntime": ("aotforge.targets.onnxruntime.tensor_parallel", "onnxruntime_extensions")}
#: Floats an all-reduce moves per barrier (larger inputs, e.g. a long prompt's, go in chunks): 4 MiB a rank.
CAPACITY = 1 << 20


def _rank_main(
    conn: Any, artifact_dir: str, record: dict[str, Any], rank: int, shm_name: str, library: str
) -> None:
    """A rank process: load the rank, then serve ``(where, method, args)`` calls until the driver hangs up."""
    tp = record["info"]["tensor_parallel"]
    comm: ShmAllReduce | None = None
    try:
        comm = ShmAllReduce(shm_name, rank, int(tp["degree"]), CAPACITY)
        backend = importlib.import_module(RANK_BACKENDS[record["name"]])
        backend.register_all_reduce(comm, library)
        rank_dir = Path(artifact_dir) / tp["ranks"][rank]
        spec = DecoderSpec.from_dict(tp["decoder"])
        engine = backend.load_rank(rank_dir, TargetRecord.from_dict(record), spec, library)
        conn.send(("ok", None))
    except Exception as e:
        if comm is not None:
            comm.abort()
        conn.send(("error", describe(e, last=True)))
        return
    runner: Any = None
    while True:
        try:
            where, method, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if where == "new_runner":
                runner, result = engine.model_runner(*args), None
            else:
                result = getattr(engine if where == "engine" else runner, method)(*args)
            comm.check()  # a native all-reduce cannot fail its run: it leaves the abort flag set instead
        except Exception as e:
            comm.abort()  # the others may wait in an all-reduce this rank never reaches
            result, e_text = None, describe(e, last=True)
        else:
            e_text = ""
        try:
            conn.send(("error", e_text) if e_text else ("ok", result))
        except OSError:  # the driver is gone (it stops the group on a failure)
            return


class RankGroup:
    """The rank processes of one artifact and the pipes to them."""

    def __init__(self, artifact_dir: Path, record: TargetRecord) -> None:
        tp = record.info["tensor_parallel"]
        self.degree = int(tp["degree"])
        if record.name not in RANK_BACKENDS:
            raise RankFailedError(f"{record.name} has no tensor-parallel runtime (only {', '.join(RANK_BACKENDS)})")
        backend = importlib.import_module(RANK_BACKENDS[record.name])
        library, self.collective = backend.prepare_all_reduce()  # before the segment: nothing to leak if it fails
        self.segment = create_segment(self.degree, CAPACITY)
        self.failed = ""
        # Forked from a clean server process (never from this one, whose thread pools may be running), which has
        # imported the rank runtime once: onnxruntime-extensions imports transformers and torch, seconds a start.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(RANK_PRELOAD[record.name]))
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        payload = {"name": record.name, "options": record.options, "info": record.info}
        for rank in range(self.degree):
            here, there = context.Pipe()
            proc = context.Process(
                target=_rank_main,
                args=(there, str(artifact_dir), payload, rank, self.segment.name, library),
                daemon=True,
            )
            proc.start()
            there.close()
            self.conns.append(here)
            self.procs.append(proc)
        try:
            self._gather()  # each rank says it loaded (and has the segment mapped)
        finally:  # the ranks keep their mappings; no name is left behind, even if this process is killed
            self.segment.unlink()

    def call(self, where: str, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank's engine (``where="engine"``) or runner; the ranks' results in order."""
        if self.failed:
            raise RankFailedError(self.failed)
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((where, method, args))
            except OSError:
                self._fail(rank, "its pipe is closed")
        return self._gather()

    def _gather(self) -> list[Any]:
        """Each rank's reply; a rank that dies meanwhile fails the call at once, whichever rank it is (the
        others are waiting for it in an all-reduce)."""
        results: list[Any] = [None] * self.degree
        errors: list[str] = []
        pending = set(range(self.degree))
        while pending:
            handles = {self.conns[r]: r for r in pending} | {self.procs[r].sentinel: r for r in pending}
            for rank in sorted({handles[h] for h in multiprocessing.connection.wait(list(handles))}):
                try:
                    status, value = self.conns[rank].recv()  # what a rank sent before it died is still read
                except (EOFError, OSError):
                    self.procs[rank].join(timeout=5)
                    self._fail(rank, f"its process exited with code {self.procs[rank].exitcode}")
                pending.discard(rank)
                if status == "ok":
                    results[rank] = value
                else:
                    errors.append(f"rank {rank}: {value}")
        if errors:
            abort_segment(self.segment)
            self.failed = (
                f"tensor-parallel ranks failed ({'; '.join(errors)}): restart the server or reload the artifact"
            )
            raise RankFailedError(self.failed)
        return results

    def _fail(self, rank: int, why: str) -> None:
        abort_segment(self.segment)  # the other ranks stop waiting for this one
        self.failed = (
            f"tensor-parallel rank {rank} of {self.degree} failed ({why}); its requests fail and the group cannot "
            "go on without its share of the KV cache: restart the server or reload the artifact"
        )
        self.close()
        raise RankFailedError(self.failed)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.conns, self.procs = [], []
        self.segment.close()

    def __del__(self) -> None:
        if self.procs:
            self.close()


def gather_logits(parts: list[np.ndarray], vocab: int) -> np.ndarray:
    """The ranks' vocabulary slices side by side, the last rank's padding rows cut off."""
    return np.concatenate(parts, axis=-1)[..., :vocab]


class RankedEngine:
    """The ``StepEngine`` of a tensor-parallel artifact (``GenerativeRunner``'s engine)."""

    def __init__(self, artifact_dir: Path, record: TargetRecord) -> None:
        self.spec = DecoderSpec.from_dict(record.info["decoder"])
        self.verify_width = int(record.info.get("speculative", {}).get("verify_width", 0))
        self.group = RankGroup(artifact_dir, record)

    def start(self, batch: int, prompt_len: int) -> None:
        self.group.call("engine", "start", batch, prompt_len)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        return gather_logits(
            self.group.call("engine", "prefill", input_ids, attention_mask, position_ids), self.spec.vocab
        )

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return gather_logits(self.group.call("engine", "decode", input_ids, write_pos), self.spec.vocab)

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return gather_logits(self.group.call("engine", "verify", input_ids, write_pos), self.spec.vocab)

    def verify_positions(self, width: int) -> int:
        return width

    def model_runner(self, max_rows: int) -> RankedModelRunner:
        self.group.call("new_runner", "", max_rows)
        return RankedModelRunner(self, max_rows)

    def close(self) -> None:
        self.group.close()


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
        return gather_logits(self.engine.group.call("runner", method, *args), self.spec.vocab)

    def allocate(self, num_blocks: int, block_size: int) -> None:
        self.engine.group.call("runner", "allocate", num_blocks, block_size)

    def kv_cache_bytes(self) -> int:
        return int(sum(self.engine.group.call("runner", "kv_cache_bytes")))

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        return self._logits("prefill", token_ids, block_table)

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        return self._logits("extend", token_ids, start, block_table)

    def decode_rows(self, rows: int) -> int:
        return rows

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        return self._logits("decode", token_ids, positions, block_tables)


def load_ranked(artifact_dir: Path, record: TargetRecord) -> GenerativeRunner:
    """A tensor-parallel artifact's runner: its ranks started, driven as one model."""
    return GenerativeRunner(RankedEngine(artifact_dir, record))
