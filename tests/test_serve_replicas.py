"""``aotforge serve ARTIFACT --replicas 2``: two Ray Serve replicas of the server behind one OpenAI-compatible
endpoint, on a real two-node Ray cluster on 127.0.0.1 inside a private network namespace
(``tests/ray_serve_replicas.py``); concurrent greedy requests answer as the artifact's own ``generate``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.ray_scenario import SKIP, serving_scenario

#: Slow: a two-node cluster, Ray Serve's controller and proxy, and two replicas each loading the artifact take two
#: minutes on two cores. The default run's real Ray cluster is tests/test_farm_ray.py's; the server the replicas run
#: is tested by default in-process (tests/test_server.py) with the same openai client.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


def test_two_replicas_behind_one_endpoint_answer_like_generate(chat_artifact: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(0, 256, n)] for n in (3, 12, 7, 20, 5, 9)]
    got, want = serving_scenario("ray_serve_replicas.py", tmp_path, chat_artifact, chat_artifact, prompts, 8)
    assert got["tokens"] == want, got["log"]
    assert got["states"] == {"aotforge": {"RUNNING": 2}}, got
    # Every listener is on loopback, or a wildcard (Ray Serve binds two on [::]), which this namespace's loopback
    # alone can reach; the endpoint itself is on 127.0.0.1.
    hosts = {p.rsplit(":", 1)[0] for p in got["ports"]}
    assert hosts <= {"127.0.0.1", "::ffff:127.0.0.1", "::", "0.0.0.0"}, got["ports"]
