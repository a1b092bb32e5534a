"""``aotforge serve ARTIFACT --replicas 2``: two Ray Serve replicas of the server behind one OpenAI-compatible
endpoint, on a real two-node Ray cluster on 127.0.0.1 inside a private network namespace
(``tests/ray_serve_replicas.py``); concurrent greedy requests answer as the artifact's own ``generate``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.test_farm_ray import ROOT, SKIP

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def test_two_replicas_behind_one_endpoint_answer_like_generate(chat_artifact: Path, tmp_path: Path) -> None:
    import aotforge

    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(0, 256, n)] for n in (3, 12, 7, 20, 5, 9)]
    new = 8
    loaded = aotforge.load(chat_artifact)
    want = [loaded.generate(np.array([p]), new, ignore_eos=True)[0, len(p) :].tolist() for p in prompts]
    (tmp_path / "request.json").write_text(json.dumps({"prompts": prompts, "new": new}))
    script = (
        f"ip link set lo up && exec {sys.executable} {ROOT / 'tests' / 'ray_serve_replicas.py'} "
        f"{tmp_path} {chat_artifact} {tmp_path / 'request.json'}"
    )
    run = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["tokens"] == want, got["log"]
    assert got["states"] == {"aotforge": {"RUNNING": 2}}, got
    # Every listener is on loopback, or a wildcard (Ray Serve binds two on [::]), which this namespace's loopback
    # alone can reach; the endpoint itself is on 127.0.0.1.
    hosts = {p.rsplit(":", 1)[0] for p in got["ports"]}
    assert hosts <= {"127.0.0.1", "::ffff:127.0.0.1", "::", "0.0.0.0"}, got["ports"]
