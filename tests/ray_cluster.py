"""A real two-node Ray cluster on 127.0.0.1 for the farm tests, run inside a private network namespace.

Outside a namespace Ray binds and dials this machine's interface address; tests here must use
loopback only, so ``tests/test_farm_ray.py`` runs this file as
``unshare -n sh -c 'ip link set lo up && exec python tests/ray_cluster.py SCENARIO DIR'``: a head
(2 CPUs) and a second node offering the custom resource ``accel``, each a ``ray start --block`` in
its own process group (stopped by that group, never by a process name). The scenario prints one
JSON line last: what the test asserts on.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
sys.path.insert(0, str(ROOT))
# ray start turns token authentication on by itself; a driver connects only in the same mode.
os.environ["RAY_AUTH_MODE"] = "token"
# A throw-away token for this cluster (as ``ray get-auth-token --generate`` makes one), handed to every process
# through the environment: no ~/.ray/auth_token is read or written.
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

from tests.tiny_models import relu_add  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cluster(work: Path, accel_node: bool = True, grace_s: float = 30) -> Iterator[str]:
    """Head + a node with ``accel`` (the head alone without ``accel_node``); yields the GCS address. On the way
    out each ``ray start``, the head last, gets SIGTERM and ``grace_s`` to stop its node, then its group SIGKILL."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # No drain on SIGTERM (Ray's default waits up to 30 s for a node's leases to move elsewhere; the head's never
    # do): what ran on the cluster has stopped when it is torn down.
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    head = [RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"]
    # Ray's socket paths must stay under 107 bytes: a short directory of its own, not the test's tmp_path.
    temp = Path(tempfile.mkdtemp(prefix="rayf", dir="/tmp"))
    head += [f"--temp-dir={temp}"]
    node = [RAY, "start", f"--address={address}", "--num-cpus=1", '--resources={"accel": 1}']
    procs = []
    try:
        logs: list[Path] = []
        for command in (head + common, node + common)[: 2 if accel_node else 1]:
            logs.append(work / f"ray-{len(procs)}.log")
            with logs[-1].open("wb") as log:
                procs.append(
                    subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                )
            _wait_nodes(address, procs, logs)
        yield address
    finally:
        # The second node first, the head once it is gone: a node drains through the head's GCS when it stops, and
        # with the head stopped already it waits out its whole drain timeout for a GCS that never answers.
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()  # else it stays a zombie of this process, in its group, and _reap waits it out
        _reap({proc.pid for proc in procs})
        shutil.rmtree(temp, ignore_errors=True)


def _reap(groups: set[int]) -> None:
    """Wait until no process of ``groups`` (raylet, gcs_server, workers) is left; SIGKILL them after 30 s."""
    end = time.monotonic() + 30
    while time.monotonic() < end and _members(groups):
        time.sleep(0.5)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _members(groups: set[int]) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) in groups:
                    found.append(int(proc.name))
    return found


def _wait_nodes(address: str, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    """Until every ``ray start`` says it started (then one driver waits for them all to be alive)."""
    end = time.monotonic() + 180
    while not all("Ray runtime started" in log.read_text(errors="replace") for log in logs):
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"ray start exited early (codes {[p.poll() for p in procs]}): see ray-*.log")
        if time.monotonic() > end:
            raise RuntimeError(f"the Ray cluster at {address} did not start within 180 s: see ray-*.log")
        time.sleep(0.5)
    code = (
        f"import ray, time; ray.init(address={address!r}); end = time.monotonic() + 60\n"
        f"while sum(n['Alive'] for n in ray.nodes()) < {len(procs)} and time.monotonic() < end: time.sleep(0.5)"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)


def nodes(address: str) -> dict[str, dict[str, float]]:
    code = (
        f"import json, ray; ray.init(address={address!r}); "
        "print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def listeners() -> list[str]:
    """Every listening TCP socket's local address in this namespace."""
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            host, port = fields[1].split(":")
            found.append(f"{_addr(host, v6)}:{int(port, 16)}")
    return found


def _addr(hexaddr: str, v6: bool) -> str:
    raw = bytes.fromhex(hexaddr)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def matrix(plan: Path, out: Path, executor: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "aotforge", "matrix", str(plan), "--out", str(out), "--executor", executor]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)


def routing(work: Path) -> dict:
    """Routing by a custom resource, a probe's reason from the node, and no node offering a GPU."""
    relu_add(work / "a.onnx")
    relu_add(work / "b.onnx", shape=(2, 4))
    (work / "plan.toml").write_text(
        "bench = false\n"
        '[[build]]\nmodel = "a.onnx"\ntargets = ["onnxruntime", "tensorrt"]\nvalidation_samples = 2\n'
        "[build.resources.onnxruntime]\naccel = 1\n[build.resources.tensorrt]\naccel = 1\nGPU = 0\n"
        '[[build]]\nmodel = "b.onnx"\ntargets = ["onnxruntime", "tensorrt"]\nvalidation_samples = 2\n'
    )
    with cluster(work) as address:
        ids = nodes(address)
        run = matrix(work / "plan.toml", work / "out", f"ray={address}")
        ports = listeners()
    summary = json.loads((work / "out" / "matrix.json").read_text()) if (work / "out/matrix.json").exists() else {}
    accel = [node for node, res in ids.items() if res.get("accel")]
    return {"rc": run.returncode, "stderr": run.stderr[-4000:], "summary": summary, "accel_node": accel, "ports": ports}


def tiny(work: Path) -> dict:
    """The default run's one Ray test: the head alone, one onnxruntime build of a two-op model."""
    relu_add(work / "a.onnx")
    (work / "plan.toml").write_text(
        'bench = false\n[[build]]\nmodel = "a.onnx"\ntargets = ["onnxruntime"]\nvalidation_samples = 2\n'
    )
    started = time.perf_counter()
    with cluster(work, accel_node=False, grace_s=5) as address:  # nothing of it outlives the test to stop cleanly
        up = time.perf_counter() - started
        run = matrix(work / "plan.toml", work / "out", f"ray={address}")
        built = time.perf_counter() - started
        ports = listeners()
    summary = json.loads((work / "out" / "matrix.json").read_text()) if (work / "out/matrix.json").exists() else {}
    seconds = {"cluster_up": round(up, 1), "built": round(built, 1), "total": round(time.perf_counter() - started, 1)}
    return {"rc": run.returncode, "stderr": run.stderr[-4000:], "summary": summary, "ports": ports, "seconds": seconds}


def kill_worker(work: Path) -> dict:
    """A worker killed mid-build: Ray runs the task again; the plan finishes and nothing half-written is left."""
    relu_add(work / "a.onnx")
    (work / "plan.toml").write_text(
        'bench = false\n[[build]]\nmodel = "a.onnx"\ntargets = ["tvm"]\nvalidation_samples = 2\n'
    )
    killed: list[str] = []
    with cluster(work) as address:
        stop = threading.Event()
        killer = threading.Thread(target=_kill_first_task, args=(stop, killed))
        killer.start()
        run = matrix(work / "plan.toml", work / "out", f"ray={address}")
        stop.set()
        killer.join()
    summary = json.loads((work / "out" / "matrix.json").read_text()) if (work / "out/matrix.json").exists() else {}
    left = sorted(p.name for p in (work / "out").rglob(".*") if p.name not in (".matrix",))
    return {"rc": run.returncode, "stderr": run.stderr[-4000:], "summary": summary, "killed": killed, "debris": left}


def _kill_first_task(stop: threading.Event, killed: list[str]) -> None:
    """SIGKILL the first worker process Ray titles ``ray::build_task`` (running a build), two seconds in."""
    while not stop.is_set() and not killed:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::build_task"):
                time.sleep(2.0)  # into the build: the bundle unpacked, the compile under way
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed.append(proc.name)
                return
        time.sleep(0.05)


def plan(work: Path) -> dict:
    """``WORK/plan.toml`` through the two-node cluster into ``WORK/out`` (``tools/farm_figures.py``), timed."""
    with cluster(work) as address:
        started = time.perf_counter()
        run = matrix(work / "plan.toml", work / "out", f"ray={address}")
        seconds = time.perf_counter() - started
    return {"rc": run.returncode, "stderr": run.stderr[-4000:], "seconds": round(seconds, 1)}


if __name__ == "__main__":
    scenario, directory = sys.argv[1], Path(sys.argv[2])
    result = {"routing": routing, "kill_worker": kill_worker, "plan": plan, "tiny": tiny}[scenario](directory)
    print(json.dumps(result, default=str))
