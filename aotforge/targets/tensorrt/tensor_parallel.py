"""One rank of a tensor-parallel TensorRT artifact: its prefill and decode engines on its GPU, their all-reduces run
by NCCL inside the engines (TensorRT's ``DistCollective`` layers, ``rank_graphs.py``).

A rank runs on GPU ``rank % (GPUs its process sees)``, as TensorRT-LLM places ranks (``generative.rank_mapping``).
Its NCCL communicator is bootstrapped over the collective every rank process already has (the host's shared-memory
all-reduce, or gloo between Ray actors): rank 0's unique id, summed with the other ranks' zeros, reaches all of them,
so neither the driver nor a launcher such as ``mpirun`` needs NCCL. A rank that dies leaves the others blocked in an
NCCL collective; the driver's group stops them (``process_group.ProcessGroup.fail``) and starts new ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import TargetUnavailableError
from aotforge.core.target_record import TargetRecord
from aotforge.targets.tensorrt.compat import check_engine_compat
from aotforge.targets.tensorrt.generative import DECODE_ENGINE, PREFILL_ENGINE, RANK_FILE

#: ``NCCL_UNIQUE_ID_BYTES``: the size of the id every rank sums its part of.
UNIQUE_ID_BYTES = 128

#: This process's communicator, once ``register_all_reduce`` made it (a rank process loads one rank).
_COMMUNICATOR: list[Any] = []


def prepare_all_reduce() -> tuple[str, str]:
    """Nothing to build ahead: the collectives are TensorRT's (the driver needs no CUDA)."""
    return "", "NCCL inside the engines (TensorRT DistCollective layers)"


def register_all_reduce(comm: Any, library: str) -> None:
    """Put this rank on its GPU and join the ranks' NCCL communicator, its id passed over ``comm``'s all-reduce
    (``ShmAllReduce`` or ``GlooAllReduce``: ``comm(x)`` is the sum of ``x`` over the ranks)."""
    import torch

    from aotforge.targets.tensorrt import sdk

    probe = sdk.probe_host()
    if not probe.available:
        raise TargetUnavailableError(probe.reason + ": run tensor-parallel tensorrt artifacts on NVIDIA hosts")
    torch.cuda.set_device(comm.rank % torch.cuda.device_count())
    mine = sdk.nccl_unique_id() if comm.rank == 0 else bytes(UNIQUE_ID_BYTES)
    summed = comm(np.frombuffer(mine, dtype=np.uint8).astype(np.float32))
    unique_id = np.rint(summed).astype(np.uint8).tobytes()
    _COMMUNICATOR[:] = [sdk.nccl_communicator(unique_id, comm.rank, comm.world)]


def load_rank(rank_dir: Path, record: TargetRecord, spec: DecoderSpec, library: str = "") -> Any:
    """Rank ``rank_dir``'s step engine over its two engines, its contexts on the ranks' communicator
    (``register_all_reduce`` must have run in this process)."""
    from aotforge.targets.tensorrt import sdk

    built = json.loads((rank_dir / RANK_FILE).read_text())
    gpu = sdk.query_gpu() or {}
    check_engine_compat(built, sdk.version(), gpu.get("compute_capability", ""))
    return sdk.step_engine(
        (rank_dir / PREFILL_ENGINE).read_bytes(),
        (rank_dir / DECODE_ENGINE).read_bytes(),
        spec,
        allow_host_code=bool(built.get("version_compatible")),
        communicator=sdk.communicator_capsule(_COMMUNICATOR[0]),
    )
