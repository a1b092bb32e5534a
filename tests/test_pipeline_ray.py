"""A pipeline-parallel artifact's stages as Ray actors (``--workers ray``) on a real two-node Ray cluster on
127.0.0.1 inside a private network namespace (``tests/ray_pipeline_stages.py``): placed one a node, the serving
engine's tokens identical to the unsharded artifact's, a killed stage actor failing its request with an error
naming it before the next request runs on restarted actors, and ``aotforge generate --workers ray`` the same; and
tensorrt ranks, which reserve a GPU each, refused on its GPU-less nodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aotforge
from aotforge.core.errors import OptionsError
from aotforge.core.placement import Placement, Workers
from tests.llm_models import MAX_BATCH, PROMPTS, build_text_generation
from tests.ray_scenario import SKIP, serving_scenario


def test_stage_link_hands_on_arrays_in_the_order_they_were_sent() -> None:
    """Calls into an actor's concurrency group may run out of order: the inbox still yields them as sent."""
    from aotforge.targets.generative.ray_stages import Inbox

    inbox = Inbox()
    for seq in (2, 0, 1):
        inbox.put(seq, np.full(3, seq, dtype=np.float32))
    assert [int(inbox.recv()[0]) for _ in range(3)] == [0, 1, 2]


def test_ray_workers_are_refused_for_an_artifact_without_stages(llama_ort: object) -> None:
    with pytest.raises(OptionsError, match="one model in one process: --workers ray places the stages"):
        aotforge.load(llama_ort.path, placement=Placement(Workers.RAY))  # type: ignore[attr-defined]


@pytest.mark.slow  # a two-node Ray cluster, two placements of the stages and a CLI run: 2-3 min on 2 cores
@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_stage_actors_on_two_nodes_generate_like_the_unsharded_artifact(
    llama_dir: Path, llama_ort: object, tmp_path: Path
) -> None:
    staged = build_text_generation(llama_dir, tmp_path / "pp", pipeline_parallel=2)
    prompts = [*PROMPTS, [9, 8, 7], PROMPTS[0][:5] + [11, 12, 13, 14]]
    new = 12
    reference = llama_ort.path  # type: ignore[attr-defined]
    got, want = serving_scenario("ray_pipeline_stages.py", tmp_path, staged.path, reference, prompts, new)
    placed = got["placed"]
    assert sorted(placed["actors"]) == got["nodes"] and placed["actors"] == placed["bundles"], got  # one a node
    assert got["tokens"] == want
    killed = got["killed"]
    assert killed["errors"] and "pipeline-parallel stage 0: its Ray actor died" in killed["errors"][0], killed
    assert "restarted with an empty KV cache" in killed["errors"][0] and not killed["unfinished"]
    assert killed["old_actors"] == 0, "the failed group's actors were killed"
    assert killed["after"] == want[1]
    assert (
        "Ray could not place 2 pipeline-parallel stages (2 CPU each on a node of its own) within 5 s: the "
        "cluster has 2 node(s) and 3 CPUs" in got["refused"]
    ), got["refused"]
    assert (
        "Ray could not place 2 tensor-parallel ranks (1 CPU and 1 GPU each) within 5 s: the cluster has 2 node(s) and "
        "3 CPUs and 0 GPUs" in got["gpu_refused"]
    ), got["gpu_refused"]
    assert got["cli"]["rc"] == 0, got["cli"]["err"]
    assert got["cli"]["out"].split()[:new] == [str(t) for t in want[0]]
    assert MAX_BATCH == 2  # the engine ran two sequences a step: two micro-batches through the stages
