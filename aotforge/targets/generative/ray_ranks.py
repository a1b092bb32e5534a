"""The ranks of a tensor-parallel artifact as Ray actors in a placement group: the ranks across hosts.

One actor per rank, each in a bundle of its own, placed as the pipeline stages' actors are (``ray_stages.reserve``:
``PACK`` or ``STRICT_SPREAD``). Their all-reduce cannot be the host's shared-memory segment: it is
``torch.distributed`` gloo (``gloo_all_reduce.GlooAllReduce``), which rank 0's actor sets up (its rendezvous store
on a port its node picks), the driver hands the address to every rank, and each rank's graph calls through the
Python ops the segment's fallback uses. Each actor then loads its rank exactly as a rank process does
(``rank_worker.RankWorker``), and the driver calls them as it calls the processes (``ray_stages.ActorGroup``).

A rank that dies fails the call naming it (a survivor's failed all-reduce is reported after the death, if Ray
reports that within ``SETTLE_S``); gloo has no abort flag, so the group kills the survivors, removes the placement
group, and the owner starts a new one with an empty KV pool (``process_group.GroupEngine``), as for processes.
Every node needs the artifact at the driver's path and aotforge importable.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from aotforge.core.errors import describe
from aotforge.core.placement import Placement
from aotforge.targets import loaded_shard_runtime
from aotforge.targets.generative.gloo_all_reduce import GlooAllReduce, master_store
from aotforge.targets.generative.rank_worker import RankWorker
from aotforge.targets.generative.ray_stages import ActorGroup, placed_actors

#: Seconds the ranks may take to meet (the rendezvous, each gloo connection) and one all-reduce may wait.
TIMEOUT_S = 60.0
#: Seconds a rank's error waits for Ray to report a dead rank, the likelier cause.
SETTLE_S = 5.0


@ray.remote(max_restarts=0)
class RankActor:
    """One rank, in a Ray worker process: ``rank_worker.RankWorker`` over gloo behind actor calls."""

    def __init__(self) -> None:
        self.here: dict[str, Any] = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
        self.ip = ray.util.get_node_ip_address()
        self.store: Any = None

    def rendezvous(self, world: int) -> tuple[str, int]:
        """Rank 0: the store the ranks meet at, on this node's address."""
        self.store = master_store(self.ip, world, TIMEOUT_S)
        return self.ip, int(self.store.port)

    def load(self, artifact_dir: str, record: dict[str, Any], rank: int, host: str, port: int) -> tuple[str, Any]:
        """Join the group's gloo (every rank at once: it waits for all of them), then load the rank."""
        try:
            world = int(record["info"]["tensor_parallel"]["degree"])
            comm = GlooAllReduce(self.store, host, port, rank, world, self.ip, TIMEOUT_S)
            self.worker = RankWorker(artifact_dir, record, rank, comm, library="")
        except Exception as e:  # with the node: the artifact may be missing there alone
            return "error", f"on node {self.here['node'][:12]}: {describe(e, last=True)}"
        return "ok", self.here

    def call(self, message: tuple[str, str, tuple[Any, ...]]) -> tuple[str, Any]:
        return self.worker.handle(*message)


def start_rank_actors(kind: str, artifact_dir: str, record: dict[str, Any], count: int, placement: Placement) -> Any:
    """The ``count`` rank actors of an artifact, met over gloo and loaded, as one group."""
    gpus = loaded_shard_runtime(str(record["name"]), "tensor_parallel").gpus_per_shard
    group, actors = placed_actors(RankActor, kind, count, placement, lambda r: (), gpus)
    workers = ActorGroup(kind, actors, group, settle_s=SETTLE_S)
    try:
        host, port = ray.get(actors[0].rendezvous.remote(count), timeout=TIMEOUT_S)
    except ray.exceptions.RayError as e:
        workers.fail(f"{kind} 0: could not open the ranks' rendezvous ({describe(e, last=True)})")
    loads = [actor.load.remote(artifact_dir, record, r, host, port) for r, actor in enumerate(actors)]
    loaded = workers._results(loads, stop_at_error=True)
    workers.nodes, workers.pids = [str(w["node"]) for w in loaded], [int(w["pid"]) for w in loaded]
    return workers
