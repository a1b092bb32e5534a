"""A tensor-parallel artifact's ranks as Ray actors (``--workers ray``), their all-reduce ``torch.distributed`` gloo,
on a real Ray cluster on 127.0.0.1 inside a private network namespace (``tests/ray_tensor_parallel_ranks.py``): the
serving engine's tokens identical to the unsharded artifact's, a killed rank actor failing its request with an error
naming it before the next request runs on restarted actors; the ranks one a node on a two-node cluster (slow). The
gloo collectives themselves against numpy's sums, in two processes of this host."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.llm_models import PROMPTS
from tests.ray_scenario import SKIP, serving_scenario


def _collectives(rank: int, port: int, ports: Any, results: Any) -> None:
    from aotforge.targets.generative.gloo_all_reduce import GlooAllReduce, master_store

    store = master_store("127.0.0.1", 2, 30) if rank == 0 else None
    if store is not None:
        port = int(store.port)
        ports.put(port)
    comm = GlooAllReduce(store, "127.0.0.1", port, rank, 2, "127.0.0.1", 30)
    x = np.arange(30, dtype=np.float32).reshape(2, 5, 3) * (rank + 1)
    results.put((rank, comm(x), comm.reduce_scatter(x), comm.all_gather(x[:, :3] + rank, 5)))


def test_gloo_collectives_give_the_shared_memory_ones_results() -> None:
    """All-reduce, reduce-scatter (a rank's ``ceil(T/N)`` positions, zero-padded) and all-gather (cut to ``T``) of
    two ranks, each a process."""
    context = multiprocessing.get_context("spawn")
    ports, results = context.Queue(), context.Queue()
    ranks = [context.Process(target=_collectives, args=(0, 0, ports, results))]
    ranks[0].start()
    ranks.append(context.Process(target=_collectives, args=(1, ports.get(timeout=120), ports, results)))
    ranks[1].start()
    got = {rank: rest for rank, *rest in (results.get(timeout=120) for _ in ranks)}
    for proc in ranks:
        proc.join(30)
    x = np.arange(30, dtype=np.float32).reshape(2, 5, 3)
    total = x * 1 + x * 2
    for rank, (summed, scattered, gathered) in got.items():
        np.testing.assert_array_equal(summed, total)
        want = np.zeros((2, 3, 3), dtype=np.float32)  # ceil(5 / 2) positions, rank 1's last one padding
        mine = total[:, rank * 3 : rank * 3 + 3]
        want[:, : mine.shape[1]] = mine
        np.testing.assert_array_equal(scattered, want)
        np.testing.assert_array_equal(gathered, np.concatenate([x[:, :3], 2 * x[:, :3] + 1], axis=1)[:, :5])
    assert sorted(got) == [0, 1]


def _scenario(tmp_path: Path, llama_tp: Any, llama_ort: Any, two_nodes: bool) -> tuple[dict[str, Any], list]:
    ranked = llama_tp  # conftest's: --tensor-parallel 2, shared with tests/test_tensor_parallel.py
    nodes = "two-nodes" if two_nodes else "one-node"
    script = "ray_tensor_parallel_ranks.py"
    got, want = serving_scenario(script, tmp_path, ranked.path, llama_ort.path, [*PROMPTS, [9, 8, 7]], 8, nodes)
    print("scenario seconds:", got["seconds"])
    return got, want


def _assert_served_and_recovered(got: dict[str, Any], want: list) -> None:
    assert got["placed"]["collective"] == "gloo (Ray actors)"
    assert got["tokens"] == want
    killed = got["killed"]
    assert killed["errors"] and "tensor-parallel rank 0: its Ray actor died" in killed["errors"][0], killed
    assert "restarted with an empty KV cache" in killed["errors"][0] and not killed["unfinished"]
    assert killed["old_actors"] == 0, "the failed group's surviving rank was killed"
    assert killed["after"] == want[1]


# Slow: a cluster start, two rank actors and a restart (~1.5 min on 2 cores); by default the gloo collectives run in
# the test above and Ray actors on a one-node cluster in test_pipeline_ray, the same ActorGroup and placement.
@pytest.mark.slow
@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_rank_actors_on_one_node_generate_like_the_unsharded_artifact(
    llama_tp: Any, llama_ort: Any, tmp_path: Path
) -> None:
    got, want = _scenario(tmp_path, llama_tp, llama_ort, two_nodes=False)
    _assert_served_and_recovered(got, want)


@pytest.mark.slow  # a two-node Ray cluster: its second node's start and the ranks' placement, 2-3 min on 2 cores
@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_rank_actors_on_two_nodes_generate_like_the_unsharded_artifact(
    llama_tp: Any, llama_ort: Any, tmp_path: Path
) -> None:
    got, want = _scenario(tmp_path, llama_tp, llama_ort, two_nodes=True)
    assert sorted(got["placed"]["actors"]) == got["nodes"], got["placed"]  # one a node
    _assert_served_and_recovered(got, want)
