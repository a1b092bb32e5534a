"""One rank of a tensor-parallel artifact loaded in this process, answering the driver's calls: the body of a rank
process (``ranks.py``, its collectives the host's shared-memory segment) and of a rank's Ray actor
(``ray_ranks.py``, its collectives gloo)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets import loaded_shard_runtime


class RankWorker:
    """Rank ``rank`` loaded over ``comm`` (``ShmAllReduce`` or ``GlooAllReduce``; ``library`` the native all-reduce
    library, '' for the Python ops), answering ``(where, method, args)`` calls with ``("ok", result)`` or
    ``("error", why)``."""

    def __init__(self, artifact_dir: str, record: dict[str, Any], rank: int, comm: Any, library: str) -> None:
        tp = record["info"]["tensor_parallel"]
        backend = importlib.import_module(loaded_shard_runtime(record["name"], "tensor_parallel").module)
        backend.register_all_reduce(comm, library)
        rank_dir = Path(artifact_dir) / tp["ranks"][rank]
        spec = DecoderSpec.from_dict(tp["decoder"])
        self.comm = comm
        self.engine = backend.load_rank(rank_dir, TargetRecord.from_dict(record), spec, library)
        self.runner: Any = None

    def handle(self, where: str, method: str, args: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            if where == "new_runner":
                self.runner, result = self.engine.model_runner(*args), None
            else:
                result = getattr(self.engine if where == "engine" else self.runner, method)(*args)
            self.comm.check()  # a native all-reduce cannot fail its run: it leaves the abort flag set instead
        except Exception as e:
            self.comm.abort()  # the others may wait in an all-reduce this rank never reaches
            return "error", describe(e, last=True)
        return "ok", result
