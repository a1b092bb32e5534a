"""One stage of a pipeline-parallel artifact loaded in this process, answering the driver's calls: the body of a
stage process (``stages.py``) and of a stage's Ray actor (``ray_stages.py``)."""

from __future__ import annotations

import importlib
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets import loaded_shard_runtime


class StageWorker:
    """One stage loaded and answering ``(where, method, args)`` calls with ``("ok", result)`` or ``("error", why)``:
    the body of a stage process (:func:`_stage_main`) and of a stage's Ray actor (``ray_stages.py``). ``recv`` /
    ``send`` are its ends of the links to its neighbours (anything with ``recv()`` / ``send(array)``).

    ``logits``, on one host, names the driver's shared segment of ``[slots, max_batch, vocab]`` floats
    (``stages.logits_segment``): a ``"shared"`` call's decode logits go there, in the call's slot, instead of back
    through the pipe (a decode's ``[rows, vocab]`` logits are most of what a step moves, pickled and copied twice)."""

    def __init__(
        self, artifact_dir: str, record: dict[str, Any], stage: int, recv: Any, send: Any, logits: str = ""
    ) -> None:
        pp = record["info"]["pipeline_parallel"]
        backend = importlib.import_module(loaded_shard_runtime(record["name"], "pipeline_parallel").module)
        self.link = backend.StageLink(recv, send)
        backend.register_stage_ops(self.link)
        spec = DecoderSpec.from_dict(pp["decoders"][stage])
        stage_dir = Path(artifact_dir) / pp["stages"][stage]
        self.engine = backend.load_stage(stage_dir, TargetRecord.from_dict(record), spec, self.link)
        self.last = stage == len(pp["stages"]) - 1
        self.runner: Any = None
        self.busy = 0.0
        self.segment = shared_memory.SharedMemory(name=logits) if logits and self.last else None
        self.logits = (
            np.ndarray(logits_shape(record), dtype=np.float32, buffer=self.segment.buf)
            if self.segment is not None
            else None
        )

    def handle(self, where: str, method: str, args: tuple[Any, ...]) -> tuple[str, Any]:
        started, waited = time.perf_counter(), self.link.waited
        result: Any
        try:
            if where == "new_runner":
                self.runner, result = self.engine.model_runner(*args), None
            elif where == "busy":
                result = self.busy
            elif where == "shared":  # args: the slot, then the runner's
                result = self._shared(getattr(self.runner, method)(*args[1:]), int(args[0]))
            else:
                result = getattr(self.engine if where == "engine" else self.runner, method)(*args)
        except Exception as e:
            return "error", describe(e, last=True)
        finally:
            self.busy += time.perf_counter() - started - (self.link.waited - waited)
        if where in ("engine", "runner", "shared") and not self.last:
            result = None  # only the last stage's logits mean anything
        return "ok", result

    def _shared(self, result: tuple[list[np.ndarray], np.ndarray | None], slot: int) -> tuple[list[np.ndarray], Any]:
        """A step's result with its decode logits written to the shared segment's ``slot``: their row count instead."""
        prompts, logits = result
        if self.logits is None or logits is None:
            return prompts, logits
        self.logits[slot, : len(logits)] = logits
        return prompts, len(logits)


def logits_shape(record: dict[str, Any]) -> tuple[int, int, int]:
    """The shared logits segment's ``[slots, max_batch, vocab]``: a slot for each step the serving runner can hold
    at once and the one it submits next (``stages.StagedModelRunner``: one batch in flight a stage)."""
    info = record["info"]
    slots = int(info["pipeline_parallel"]["degree"]) + 1
    return slots, int(info["decoder"]["max_batch"]), int(info["decoder"]["vocab"])
