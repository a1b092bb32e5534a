"""The stages of a pipeline-parallel artifact as Ray actors in a placement group: the model across hosts.

One actor per stage, each in a bundle of its own (``Placement.spread``: ``PACK`` fills as few nodes as fit,
``STRICT_SPREAD`` puts every stage on a node of its own). Each actor loads its stage exactly as a stage process
does (``stages.StageWorker``); only the link between neighbours changes: a stage graph's ``StageSend`` calls
the next stage's actor (``deliver``, in a concurrency group of its own, so it runs while that actor's stage call
waits in its ``StageRecv``), and Ray moves the hidden states (inline, or through the object store when large).
The driver calls every actor at once and waits on their results as it waits on the stage processes' pipes; an
actor that dies fails the call naming its stage, the group is stopped (its actors killed, the placement group
removed) and the owner starts a new one (``process_group.GroupEngine``), as for processes.

Every node needs the artifact at the driver's path (a shared file system, or ``aotforge pull`` on each) and
aotforge importable; an actor that cannot load its stage says which node it ran on.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from aotforge.core.errors import RankFailedError, TargetUnavailableError, describe
from aotforge.core.placement import Placement, Spread
from aotforge.targets.generative.stage_worker import StageWorker


class Inbox:
    """The receiving end of a stage's link: what the previous stage's actor delivered, in the order it was sent
    (calls into a concurrency group may run out of order, so each carries its number)."""

    def __init__(self) -> None:
        self.ready = threading.Condition()
        self.items: dict[int, np.ndarray] = {}
        self.next = 0

    def put(self, seq: int, array: np.ndarray) -> None:
        with self.ready:
            self.items[seq] = array
            self.ready.notify_all()

    def recv(self) -> np.ndarray:
        with self.ready:
            self.ready.wait_for(lambda: self.next in self.items)
            self.next += 1
            return self.items.pop(self.next - 1)


class Outbox:
    """The sending end: each array goes to the next stage's actor as a ``deliver`` call (not waited for: a dead
    neighbour fails its own call, which the driver sees)."""

    def __init__(self) -> None:
        self.target: Any = None
        self.sent = 0

    def send(self, array: np.ndarray) -> None:
        self.target.deliver.remote(self.sent, array)
        self.sent += 1


@ray.remote(concurrency_groups={"link": 1}, max_restarts=0)  # type: ignore[call-overload]  # (ray's stubs lack it)
class StageActor:
    """One stage, in a Ray worker process: ``stages.StageWorker`` behind actor calls."""

    def __init__(self, artifact_dir: str, record: dict[str, Any], stage: int) -> None:
        self.inbox, self.outbox = Inbox(), Outbox()
        last = stage == len(record["info"]["pipeline_parallel"]["stages"]) - 1
        here: dict[str, Any] = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
        try:
            self.worker = StageWorker(
                artifact_dir, record, stage, self.inbox if stage else None, None if last else self.outbox
            )
            self.loaded: tuple[str, Any] = ("ok", here)
        except Exception as e:  # said by ready(), with the node: the artifact may be missing there alone
            self.loaded = ("error", f"on node {here['node'][:12]}: {describe(e, last=True)}")

    def ready(self) -> tuple[str, Any]:
        return self.loaded

    def connect(self, following: Any) -> None:
        self.outbox.target = following

    def call(self, message: tuple[str, str, tuple[Any, ...]]) -> tuple[str, Any]:
        return self.worker.handle(*message)

    @ray.method(concurrency_group="link")
    def deliver(self, seq: int, array: np.ndarray) -> None:
        self.inbox.put(seq, array)


class ActorGroup:
    """Stage actors in one placement group, with ``ProcessGroup``'s interface (``call``, ``gather``, ``failed``,
    ``close``). ``nodes`` and ``pids`` say where each stage runs."""

    def __init__(self, kind: str, actors: list[Any], group: Any, settle_s: float = 0.0) -> None:
        self.kind, self.actors, self.group = kind, actors, group
        #: seconds an error reply waits for the others' replies: one that says its actor died names the cause (a
        #: rank whose peer died fails its all-reduce at once, before Ray reports the death)
        self.settle_s = settle_s
        self.size = len(actors)
        self.failed = ""
        #: each sent call's result refs, oldest first (a pipelined runner has several in flight)
        self.pending: collections.deque[list[Any]] = collections.deque()
        self.nodes: list[str] = []
        self.pids: list[int] = []

    def send(self, message: Any, order: Any = None) -> None:
        if self.failed:
            raise RankFailedError(self.failed)
        refs: list[Any] = [None] * self.size
        for i in range(self.size) if order is None else order:
            refs[i] = self.actors[i].call.remote(message)
        self.pending.append(refs)

    def gather(self, stop_at_error: bool = False) -> list[Any]:
        """The replies to the oldest call sent (an actor runs its calls in the order they were sent)."""
        return self._results(self.pending.popleft(), stop_at_error)

    def call(self, message: Any, order: Any = None, stop_at_error: bool = False) -> list[Any]:
        self.send(message, order)
        return self.gather(stop_at_error)

    def _results(self, refs: list[Any], stop_at_error: bool) -> list[Any]:
        """Each actor's reply to ``refs`` as they come; a dead actor fails the call at once, an error reply at once
        with ``stop_at_error`` (its neighbours wait on it) or once all answered."""
        results: list[Any] = [None] * self.size
        errors: list[str] = []
        where = {ref: i for i, ref in enumerate(refs)}
        while where:
            done, _ = ray.wait(list(where), num_returns=1)
            i = where.pop(done[0])
            try:
                status, value = ray.get(done[0])
            except ray.exceptions.RayActorError as e:
                self.fail(f"{self.kind} {i}: its Ray actor died ({_first_line(e)})")
            except ray.exceptions.RayError as e:
                self.fail(f"{self.kind} {i}: Ray failed its call ({_first_line(e)})")
            if status == "ok":
                results[i] = value
            else:
                errors.append(f"{self.kind} {i}: {value}")
                self._fail_if_one_died(where)
            if errors and (stop_at_error or not where):
                self.fail("; ".join(errors))
        return results

    def _fail_if_one_died(self, where: dict[Any, int]) -> None:
        """Fail naming the first of ``where``'s actors found dead within ``settle_s``."""
        deadline, pending = time.monotonic() + self.settle_s, list(where)
        while pending and (left := deadline - time.monotonic()) > 0:
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self.fail(f"{self.kind} {where[ref]}: its Ray actor died ({_first_line(e)})")
                except ray.exceptions.RayError:
                    pass

    def fail(self, why: str) -> NoReturn:
        self.failed = why
        self.close()
        raise RankFailedError(why)

    def close(self) -> None:
        """Kill the actors (one blocked on a dead neighbour too) and give the bundles back."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)
        self.actors, self.group = [], None


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def connect(placement: Placement) -> None:
    """Join ``placement.ray_address`` (or start a local Ray instance), unless this process already is in one."""
    if not ray.is_initialized():
        ray.init(address=placement.ray_address, include_dashboard=False, log_to_driver=False)


def reserve(kind: str, count: int, placement: Placement, gpus: int = 0) -> Any:
    """A placement group of ``count`` one-worker bundles (``gpus`` GPUs each beside the CPUs), placed; a clear
    refusal if Ray cannot place it."""
    bundles = [{"CPU": placement.cpus_per_worker, **({"GPU": gpus} if gpus else {})} for _ in range(count)]
    group = placement_group(bundles, strategy=placement.spread.value)
    try:
        ray.get(group.ready(), timeout=placement.placement_timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        alive = [n for n in ray.nodes() if n["Alive"]]
        cpus = sum(n["Resources"].get("CPU", 0) for n in alive)
        each = " on a node of its own" if placement.spread is Spread.STRICT_SPREAD else ""
        need, has = f"{placement.cpus_per_worker:g} CPU", f"{cpus:g} CPUs"
        if gpus:
            need += f" and {gpus} GPU"
            has += f" and {sum(n['Resources'].get('GPU', 0) for n in alive):g} GPUs"
        raise TargetUnavailableError(
            f"Ray could not place {count} {kind}s ({need} each{each}) within {placement.placement_timeout_s:g} s: the "
            f"cluster has {len(alive)} node(s) and {has}. Add nodes or CPUs, free them, or ask for {Spread.PACK.value}"
        ) from None
    return group


def start_stage_actors(kind: str, artifact_dir: str, record: dict[str, Any], count: int, placement: Placement) -> Any:
    """The ``count`` stage actors of an artifact, loaded and linked, as one group."""
    group, actors = placed_actors(StageActor, kind, count, placement, lambda s: (artifact_dir, record, s))
    workers = ActorGroup(kind, actors, group)
    loaded = workers._results([actor.ready.remote() for actor in actors], stop_at_error=True)
    workers.nodes, workers.pids = [str(w["node"]) for w in loaded], [int(w["pid"]) for w in loaded]
    ray.get([actors[s].connect.remote(actors[s + 1]) for s in range(count - 1)])
    return workers


def placed_actors(
    actor: Any,
    kind: str,
    count: int,
    placement: Placement,
    arguments: Callable[[int], tuple[Any, ...]],
    gpus: int = 0,
) -> tuple[Any, list[Any]]:
    """A placement group of ``count`` bundles on the cluster and one ``actor`` in each, made with
    ``arguments(index)``, with ``gpus`` GPUs each (Ray then shows the actor those GPUs only)."""
    connect(placement)
    group = reserve(kind, count, placement, gpus)
    actors = [
        actor.options(
            num_cpus=placement.cpus_per_worker,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i),
        ).remote(*arguments(i))
        for i in range(count)
    ]
    return group, actors


def bundle_nodes(group: Any) -> list[str]:
    """The node each bundle of ``group`` was placed on (Ray's own record)."""
    return [str(n) for _, n in sorted(placement_group_table(group)["bundles_to_node_id"].items())]
