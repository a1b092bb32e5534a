"""Where the workers of a sharded artifact run: processes on this host, or Ray actors on a cluster.

A runtime option, not a build one: the same artifact loads either way (``aotforge.load(path, placement=...)``,
``aotforge generate / serve --workers ray``).
"""

from __future__ import annotations

import dataclasses
import enum


class Workers(enum.Enum):
    """What runs each stage of a pipeline-parallel artifact, or each rank of a tensor-parallel one."""

    #: one process per stage (rank) on this host: pipes between stages (``targets/generative/stages.py``), the ranks'
    #: all-reduce in shared memory (``ranks.py``)
    PROCESSES = "processes"
    #: one Ray actor per stage (rank) in a placement group: actor calls between stages (``ray_stages.py``), the ranks'
    #: all-reduce over gloo (``ray_ranks.py``)
    RAY = "ray"


class Spread(enum.Enum):
    """Ray's placement group strategy for the workers' bundles (one CPU each)."""

    #: as few nodes as fit (one host when it has the CPUs): the link is the object store, not the network
    PACK = "PACK"
    #: each worker on a node of its own: the model spans hosts, and a placement fails if there are too few
    STRICT_SPREAD = "STRICT_SPREAD"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a sharded artifact's workers run. ``ray_address`` (``HEAD:PORT``) joins that Ray cluster; without it
    a local Ray instance is started (or the one this process is already connected to, e.g. a Ray Serve replica's
    is used)."""

    workers: Workers = Workers.PROCESSES
    ray_address: str | None = None
    spread: Spread = Spread.PACK
    #: CPUs each worker's bundle reserves (a stage runs one intra-op thread by default)
    cpus_per_worker: float = 1.0
    #: seconds Ray may take to place every bundle before the load is refused
    placement_timeout_s: float = 120.0
