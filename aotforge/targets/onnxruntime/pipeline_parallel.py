"""One stage of a pipeline-parallel ONNX Runtime artifact: its sessions, with the graph's send and receive supplied.

A stage graph's ``ai.onnx.contrib::StageSend`` / ``StageRecv`` (``compiler/generative/collectives.py``) run as
onnxruntime-extensions Python ops over the pipes to the neighbouring stages (``StageLink``), as a rank graph's
all-reduce does (``tensor_parallel.py``). The stage is otherwise the unsharded engine (``decoder.OrtStepEngine``)
over the stage's own graphs, weights and cache of its layers; its serving runner (:class:`StageRunner`) runs a
decode as micro-batches, each on its own range of working rows, so that the next stage works on micro-batch
``k`` while this one works on ``k + 1``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import CompileError, describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets.onnxruntime import python_ops
from aotforge.targets.onnxruntime.decoder import OrtStepEngine
from aotforge.targets.onnxruntime.model_runner import OrtModelRunner
from aotforge.targets.onnxruntime.target import session_options, stored_options

#: The ops a stage graph calls (``collectives.SEND_OP`` / ``RECV_OP``), in onnxruntime-extensions' Python-op domain.
SEND_OP, RECV_OP = "StageSend", "StageRecv"


class StageLink:
    """A stage's ends of the pipes to its neighbours, as the graph's send and receive ops call them.

    ``order`` (set by the runner around a micro-batch) maps the graph's batch rows to the call's sequences, so
    what crosses a pipe is always in the call's order, whichever working rows each stage ran it on.
    ``waited`` adds up the seconds spent blocked on a neighbour: the stage's share of the pipeline's bubble."""

    def __init__(self, recv_conn: Any, send_conn: Any) -> None:
        self.recv_conn, self.send_conn = recv_conn, send_conn
        self.order: np.ndarray | None = None
        self.waited = 0.0

    def send(self, hidden: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        self.send_conn.send(hidden if self.order is None else hidden[self.order])
        self.waited += time.perf_counter() - started
        return hidden

    def recv(self, input_ids: np.ndarray, like: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        hidden = np.asarray(self.recv_conn.recv(), dtype=np.float32)
        self.waited += time.perf_counter() - started
        expected = (*input_ids.shape, like.shape[-1])
        if hidden.shape != expected:
            raise CompileError(f"stage input: received hidden states {hidden.shape}, the graph expects {expected}")
        if self.order is None:
            return hidden
        ordered = np.empty_like(hidden)
        ordered[self.order] = hidden
        return ordered


def register_stage_ops(link: StageLink) -> None:
    """Make the stage graphs' StageSend / StageRecv call ``link`` in this process (before its sessions open)."""
    types = python_ops.dtypes()
    python_ops.declare(SEND_OP, [types.dt_float], [types.dt_float])(link.send)
    python_ops.declare(RECV_OP, [types.dt_int64, types.dt_float], [types.dt_float])(link.recv)


def load_stage(stage_dir: Path, record: TargetRecord, spec: DecoderSpec, link: StageLink) -> StageEngine:
    """Stage ``stage_dir``'s step engine; ``register_stage_ops`` must have run in this process."""
    options = stored_options(stage_dir, record)
    settings = session_options(options)
    settings.register_custom_ops_library(python_ops.library_path())
    width = int(record.info.get("speculative", {}).get("verify_width", 0))
    try:
        engine = StageEngine(stage_dir, spec, settings, list(options.providers), width, huge_pages=options.huge_pages)
    except CompileError as e:
        raise CompileError(f"stage {stage_dir.name}: {describe(e)}") from e
    engine.link = link
    return engine


class StageEngine(OrtStepEngine):
    """The unsharded step engine over a stage's graphs; its serving runner runs decodes in micro-batches."""

    link: StageLink

    def model_runner(self, max_rows: int) -> StageRunner:
        return StageRunner(self, max_rows)


class StageRunner(OrtModelRunner):
    """``OrtModelRunner`` whose decode runs as ``parts`` micro-batches, each over the working rows of its
    sequences' places in the batch, so a sequence that keeps its place keeps its row. ``first`` offsets those rows:
    batches in flight together run on rows of their own, so neither moves the other's sequences off theirs."""

    def __init__(self, engine: StageEngine, max_rows: int) -> None:
        spec, sessions = engine.spec, (engine.prefill_session, engine.decode_session, engine.verify_session)
        super().__init__(spec, *sessions, max_rows=max_rows)
        self.link = engine.link

    def decode(
        self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray, parts: int = 1, first: int = 0
    ) -> np.ndarray:
        paged = self._rows()
        n, link, offset = len(token_ids), self.link, first
        size = -(-n // parts)
        out = []
        for lo in range(0, n, size):
            hi, first = min(lo + size, n), offset + lo
            tables, where = block_tables[lo:hi], np.asarray(positions[lo:hi], dtype=np.int64)
            order = paged.assign(tables, first)
            for i, row in enumerate(order):
                paged.load(row, tables[i], int(where[i]))
            binding, ids, write_pos, logits = self._part(first, hi - lo)
            local = order - first
            ids[local, 0] = token_ids[lo:hi]
            write_pos[local] = where
            link.order = local
            try:
                self.decode_session.run_with_iobinding(binding)
            finally:
                link.order = None
            paged.store(order, tables, where)
            out.append(logits[local])
        return np.concatenate(out)

    def step(
        self,
        chunks: list[tuple[np.ndarray, int, np.ndarray]],
        decode: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
        parts: int,
        first: int = 0,
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        """The prompt chunks, then the decode's micro-batches from working row ``first``, one after the other:
        every stage runs them in the same order, so each is one more item through the pipeline
        (``stages.StagedModelRunner.step``)."""
        prompts = [
            self.prefill(ids, table) if not start else self.extend(ids, start, table) for ids, start, table in chunks
        ]
        return prompts, self.decode(*decode, parts, first) if decode is not None else None

    def _part(self, first: int, rows: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """The decode binding over working rows ``first .. first + rows - 1``, made once per range."""
        import onnxruntime as ort

        key = first * (self.max_rows + 1) + rows
        if key in self._decodes:
            return self._decodes[key]
        binding = self.decode_session.io_binding()
        ids = np.zeros((rows, 1), dtype=np.int64)
        positions = np.zeros((rows, 1), dtype=np.int64)
        logits = np.empty((rows, self.spec.vocab), dtype=np.float32)
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        for name, array in (("input_ids", ids), ("position_ids", positions), ("write_pos", positions.reshape(rows))):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        self._bind_rows(binding, slice(first, first + rows))
        self._decodes[key] = (binding, ids, positions.reshape(rows), logits)
        return self._decodes[key]
