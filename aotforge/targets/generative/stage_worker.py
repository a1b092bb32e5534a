"""One stage of a pipeline-parallel artifact loaded in this process, answering the driver's calls: the body of a
stage process (``stages.py``) and of a stage's Ray actor (``ray_stages.py``)."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets import loaded_shard_runtime


class StageWorker:
    """One stage loaded and answering ``(where, method, args)`` calls with ``("ok", result)`` or ``("error", why)``:
    the body of a stage process (:func:`_stage_main`) and of a stage's Ray actor (``ray_stages.py``). ``recv`` /
    ``send`` are its ends of the links to its neighbours (anything with ``recv()`` / ``send(array)``)."""

    def __init__(self, artifact_dir: str, record: dict[str, Any], stage: int, recv: Any, send: Any) -> None:
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

    def handle(self, where: str, method: str, args: tuple[Any, ...]) -> tuple[str, Any]:
        started, waited = time.perf_counter(), self.link.waited
        try:
            if where == "new_runner":
                self.runner, result = self.engine.model_runner(*args), None
            elif where == "busy":
                result = self.busy
            else:
                result = getattr(self.engine if where == "engine" else self.runner, method)(*args)
        except Exception as e:
            return "error", describe(e, last=True)
        finally:
            self.busy += time.perf_counter() - started - (self.link.waited - waited)
        if where in ("engine", "runner") and not self.last:
            result = None  # only the last stage's logits mean anything
        return "ok", result
