"""A pipeline-parallel artifact's stages as Ray actors on a real two-node Ray cluster on 127.0.0.1
(``tests/ray_cluster.py``), run inside a private network namespace by ``tests/test_pipeline_ray.py``:

    python tests/ray_pipeline_stages.py WORK ARTIFACT REQUEST_JSON

The serving engine runs every prompt over the stages placed one a node (STRICT_SPREAD); then a stage actor is
killed mid-request, and a request after it runs on the restarted stages; a placement the cluster cannot hold is
refused; then ``aotforge generate --workers ray`` runs one prompt. Prints one JSON line last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.ray_cluster import ROOT, cluster, nodes  # noqa: E402


def _run(engine: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    from aotforge.runtime.params import SamplingParams

    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=new, temperature=0))
    while engine.has_unfinished():
        for out in engine.step():
            if out.error:
                raise RuntimeError(out.error)
            got[out.request_id] += out.token_ids
    return [got[f"r{i}"] for i in range(len(prompts))]


def _kill_and_recover(engine: Any, prompts: list[list[int]], new: int) -> dict[str, Any]:
    """SIGKILL stage 0's actor mid-request: what the request gets, and a request after it."""
    from aotforge.runtime.params import SamplingParams

    engine.add_request("a", prompts[0], SamplingParams(max_tokens=30, temperature=0))
    engine.step()  # the prompt and its first token
    workers = engine.runner.engine.group.workers
    os.kill(workers.pids[0], signal.SIGKILL)
    errors = [out.error for _ in range(3) for out in engine.step() if out.error]
    left = engine.has_unfinished()
    after = _run(engine, [prompts[1]], new)[0]
    return {"errors": errors, "unfinished": left, "after": after, "old_actors": len(workers.actors)}


def _refusal(artifact: Path, address: str) -> str:
    """What loading says when Ray cannot place the stages: two CPUs each on nodes of their own (the second node
    has one)."""
    import aotforge
    from aotforge.core.errors import TargetUnavailableError
    from aotforge.core.placement import Placement, Spread, Workers

    placement = Placement(Workers.RAY, address, Spread.STRICT_SPREAD, cpus_per_worker=2, placement_timeout_s=5)
    try:
        aotforge.load(artifact, placement=placement)
    except TargetUnavailableError as e:
        return str(e)
    return "loaded"


def _gpu_refusal(address: str) -> str:
    """What starting a tensorrt artifact's rank actors says on this cluster, whose nodes offer no GPU: each rank's
    actor reserves one (Ray hides the GPUs from an actor that asks for none)."""
    from aotforge.core.errors import TargetUnavailableError
    from aotforge.core.placement import Placement, Workers
    from aotforge.targets.generative.ray_ranks import start_rank_actors

    record = {"name": "tensorrt", "options": {}, "info": {"tensor_parallel": {"degree": 2}}}
    try:
        start_rank_actors(
            "tensor-parallel rank", "/nowhere", record, 2, Placement(Workers.RAY, address, placement_timeout_s=5)
        )
    except TargetUnavailableError as e:
        return str(e)
    return "placed"


def main(work: Path, artifact: Path, request: dict[str, Any]) -> dict[str, Any]:
    from aotforge.artifacts.engine_loader import load_engine
    from aotforge.core.placement import Placement, Spread, Workers
    from aotforge.runtime.params import EngineConfig
    from aotforge.targets.generative.ray_stages import bundle_nodes

    prompts, new = request["prompts"], request["new"]
    with cluster(work) as address:
        cluster_nodes = sorted(nodes(address))
        placement = Placement(Workers.RAY, address, Spread.STRICT_SPREAD)
        engine, _, _ = load_engine(artifact, EngineConfig(max_num_seqs=2), placement)
        try:
            engine.eos_token_ids = frozenset()
            group = engine.runner.engine.group.workers
            placed = {"actors": group.nodes, "bundles": bundle_nodes(group.group)}
            tokens = _run(engine, prompts, new)
            killed = _kill_and_recover(engine, prompts, new)
        finally:
            engine.runner.engine.close()
        refused = _refusal(artifact, address)
        gpu_refused = _gpu_refusal(address)
        import ray

        ray.shutdown()
        command = [sys.executable, "-m", "aotforge", "generate", str(artifact), "--workers", "ray"]
        command += ["--ray-address", address, "--spread", "strict-spread", "--ignore-eos"]
        command += ["--prompt-ids", ",".join(map(str, prompts[0])), "--max-new-tokens", str(new)]
        cli = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {
        "nodes": cluster_nodes,
        "placed": placed,
        "tokens": tokens,
        "killed": killed,
        "refused": refused,
        "gpu_refused": gpu_refused,
        "cli": {"rc": cli.returncode, "out": cli.stdout, "err": cli.stderr[-3000:]},
    }


if __name__ == "__main__":
    directory, artifact_dir = Path(sys.argv[1]), Path(sys.argv[2])
    print(json.dumps(main(directory, artifact_dir, json.loads(Path(sys.argv[3]).read_text()))))
