"""``aotforge matrix --executor ray`` on a real two-node Ray cluster, on 127.0.0.1 inside a private network
namespace (``tests/ray_cluster.py``): nothing here binds or dials this machine's interface address."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ray_scenario import SKIP, run_scenario

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def _scenario(name: str, work: Path) -> dict:
    return run_scenario("ray_cluster.py", name, work, timeout=1500)


def test_a_plan_builds_on_a_one_node_ray_cluster(tmp_path: Path) -> None:
    """The default run's real Ray executor: a head on loopback builds a one-row plan; the artifact is whole and
    says Ray built it, and every socket the cluster listened on was on loopback."""
    import ray  # noqa: F401  (a dev dependency: missing, it fails here rather than skipping)

    got = _scenario("tiny", tmp_path)
    print(f"ray tiny plan: {got['seconds']}")
    assert got["rc"] == 0, got["stderr"]
    (row,) = got["summary"]["rows"]
    assert row["status"] == "ok" and row["worker"]["executor"] == "ray", row
    from aotforge.artifacts.hashing import require_intact
    from aotforge.artifacts.manifest import read_manifest

    require_intact(Path(row["path"]), read_manifest(Path(row["path"])))
    assert got["ports"] and all(p.rsplit(":", 1)[0] in ("127.0.0.1", "::ffff:127.0.0.1") for p in got["ports"])


def test_ray_is_imported_only_when_asked() -> None:
    code = (
        "import sys, aotforge, aotforge.compiler.cli, aotforge.compiler.farm.matrix, aotforge.compiler.farm.multi; "
        "print('ray' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert run.stdout.strip() == "False", run.stderr


@pytest.mark.slow  # starts a two-node Ray cluster: 1-2 min on 2 cores, a sixth of the default run
def test_routing_probe_reason_and_no_node_offers_gpu(tmp_path: Path) -> None:
    """A head and a node with ``accel``: builds asking for it run there; a target that node's probe refuses comes
    back with the probe's reason; a build asking for a GPU nobody has fails at once, naming the GPU."""
    got = _scenario("routing", tmp_path)
    assert got["rc"] == 6, got["stderr"]  # EXIT_PARTIAL: the tensorrt rows fail, after the others finished
    rows = {(r["model"], r["target"]): r for r in got["summary"]["rows"]}
    a, b = rows[("a", "onnxruntime")], rows[("b", "onnxruntime")]
    assert a["status"] == b["status"] == "ok", got["stderr"]
    assert a["worker"]["executor"] == "ray" and [a["worker"]["node"]] == got["accel_node"]
    assert "cannot finish" in rows[("a", "tensorrt")]["error"] and "tensorrt needs" in rows[("a", "tensorrt")]["error"]
    assert got["accel_node"][0][:12] in rows[("a", "tensorrt")]["error"]  # the node that probed
    assert "no node offers GPU: 1 needed" in rows[("b", "tensorrt")]["error"]
    assert Path(a["path"], "manifest.json").is_file() and a["toolchain"]
    # Every listening socket of the cluster is on loopback.
    assert got["ports"] and all(p.rsplit(":", 1)[0] in ("127.0.0.1", "::ffff:127.0.0.1") for p in got["ports"])


@pytest.mark.slow  # two Ray nodes and a tvm build under a kill: about two minutes on 2 cores
def test_worker_killed_mid_build_is_retried_and_leaves_nothing(tmp_path: Path) -> None:
    got = _scenario("kill_worker", tmp_path)
    assert got["killed"], "no ray::build_task process was seen to kill"
    assert got["rc"] == 0, got["stderr"]
    (row,) = got["summary"]["rows"]
    assert row["status"] == "ok" and row["worker"]["executor"] == "ray"
    assert got["debris"] == []  # no .staging-, .unpack-, .pack- or .farm- left in the output
    from aotforge.artifacts.hashing import require_intact
    from aotforge.artifacts.manifest import read_manifest

    require_intact(Path(row["path"]), read_manifest(Path(row["path"])))
