"""One rank of a tensor-parallel ONNX Runtime artifact: its sessions, with the graph's collectives supplied.

A rank graph's ``ai.onnx.contrib::AllReduce`` (``compiler/generative/collectives.py``; a sequence-parallel
prefill's ``ReduceScatter`` and ``AllGather`` likewise) runs the host's
shared-memory all-reduce (``targets/generative/shm_all_reduce.py``'s segment) as a native custom-op library
(``native_all_reduce.py``), or, on a host without a C compiler, as an onnxruntime-extensions Python op. Chosen
over graphs cut at every all-reduce (61 sessions a step, each boundary tensor bound by hand) and over
torch.distributed gloo (a TCP round trip a call): figures in docs/benchmarks.md (tools/tp_collectives.py).
The rank is otherwise the unsharded engine (``decoder.OrtStepEngine``) over the rank's own graphs, weights and
(1/N) cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import AotforgeError, CompileError, describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets.generative.shm_all_reduce import ShmAllReduce
from aotforge.targets.onnxruntime import native_all_reduce, python_ops
from aotforge.targets.onnxruntime.decoder import OrtStepEngine
from aotforge.targets.onnxruntime.target import session_options, stored_options

#: The ops the rank graphs call (``collectives.DOMAIN`` / ``OP_TYPE`` ...: onnxruntime-extensions' Python-op domain).
OP_TYPE, REDUCE_SCATTER_OP, ALL_GATHER_OP = "AllReduce", "ReduceScatter", "AllGather"


def prepare_all_reduce() -> tuple[str, str]:
    """``(library, how)``: the native all-reduce library the ranks load ('' for the Python op) and a line saying
    which one they run and why. Called once by the driver, before the ranks start."""
    try:
        return str(native_all_reduce.build_library()), "native"
    except AotforgeError as e:  # no compiler, or it failed: the Python op still runs the ranks, slower
        python_ops.library_path()  # and without onnxruntime-extensions, nothing can: say so now
        return "", f"python op (the native all-reduce is unavailable: {describe(e)})"


def register_all_reduce(comm: ShmAllReduce, library: str) -> None:
    """Make the rank graphs' AllReduce (ReduceScatter, AllGather) run ``comm``'s in this process (before its
    sessions open)."""
    if library:
        native_all_reduce.attach(Path(library), comm)
        return
    types = python_ops.dtypes()

    def all_gather(x: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return comm.all_gather(x, tokens.shape[1])

    floats = [types.dt_float]
    ops: list[tuple[str, list[int], Callable[..., np.ndarray]]] = [
        (OP_TYPE, floats, comm),
        (REDUCE_SCATTER_OP, floats, comm.reduce_scatter),
        (ALL_GATHER_OP, [*floats, types.dt_int64], all_gather),
    ]
    for op_type, inputs, run in ops:
        python_ops.declare(op_type, inputs, floats)(run)


def load_rank(rank_dir: Path, record: TargetRecord, spec: DecoderSpec, library: str = "") -> OrtStepEngine:
    """Rank ``rank_dir``'s step engine; ``register_all_reduce(..., library)`` must have run in this process."""
    options = stored_options(rank_dir, record)
    settings = session_options(options)
    settings.register_custom_ops_library(library or python_ops.library_path())
    width = int(record.info.get("speculative", {}).get("verify_width", 0))
    try:
        return OrtStepEngine(rank_dir, spec, settings, list(options.providers), width, huge_pages=options.huge_pages)
    except CompileError as e:
        raise CompileError(f"rank {rank_dir.name}: {describe(e)}") from e
