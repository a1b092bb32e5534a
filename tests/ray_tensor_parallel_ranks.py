"""A tensor-parallel artifact's ranks as Ray actors (their all-reduce gloo) on a real Ray cluster on 127.0.0.1
(``tests/ray_cluster.py``), run inside a private network namespace by ``tests/test_tensor_parallel_ray.py``:

    python tests/ray_tensor_parallel_ranks.py WORK ARTIFACT REQUEST_JSON one-node|two-nodes

The serving engine runs every prompt over the ranks (packed on the head, or one a node with ``two-nodes``); then a
rank's actor is killed mid-request, and a request after it runs on the restarted ranks. Prints one JSON line last.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.ray_cluster import cluster, nodes  # noqa: E402
from tests.ray_pipeline_stages import _kill_and_recover, _run  # noqa: E402


def main(work: Path, artifact: Path, request: dict[str, Any], two_nodes: bool) -> dict[str, Any]:
    from aotforge.artifacts.engine_loader import load_engine
    from aotforge.core.placement import Placement, Spread, Workers
    from aotforge.runtime.params import EngineConfig

    prompts, new = request["prompts"], request["new"]
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    with cluster(work, accel_node=two_nodes, grace_s=30 if two_nodes else 5) as address:
        seconds["cluster_up"] = time.perf_counter() - started
        cluster_nodes = sorted(nodes(address))
        placement = Placement(Workers.RAY, address, Spread.STRICT_SPREAD if two_nodes else Spread.PACK)
        engine, _, _ = load_engine(artifact, EngineConfig(max_num_seqs=2), placement)
        seconds["loaded"] = time.perf_counter() - started
        try:
            engine.eos_token_ids = frozenset()
            group = engine.runner.engine.group
            placed = {"actors": group.workers.nodes, "collective": group.collective}
            tokens = _run(engine, prompts, new)
            seconds["served"] = time.perf_counter() - started
            killed = _kill_and_recover(engine, prompts, new)
            seconds["recovered"] = time.perf_counter() - started
        finally:
            engine.runner.engine.close()
        import ray

        ray.shutdown()
    seconds["total"] = time.perf_counter() - started
    timings = {k: round(v, 1) for k, v in seconds.items()}
    return {"nodes": cluster_nodes, "placed": placed, "tokens": tokens, "killed": killed, "seconds": timings}


if __name__ == "__main__":
    directory, artifact_dir = Path(sys.argv[1]), Path(sys.argv[2])
    request = json.loads(Path(sys.argv[3]).read_text())
    print(json.dumps(main(directory, artifact_dir, request, sys.argv[4] == "two-nodes")))
