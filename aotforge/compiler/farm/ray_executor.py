"""The Ray executor: each build is a Ray task on a node that offers what its target needs.

The task's input is the target-independent bundle (a tarball of it, with its sha256), so a worker
node needs aotforge and its own target's SDK, never the source model's Python code. Its result is
the artifact as a deterministic tarball (``artifacts.packing``) with its sha256, checked here
before the artifact is unpacked (every file verified again) into its place: a task that dies
mid-build leaves only its own scratch directory on its node (swept by the next task there), Ray
retries it, and nothing half-written reaches ``out``. A build that no node of the cluster can serve
fails at once, naming the resource, instead of waiting forever.

Ray is imported only here, and only when ``--executor ray`` asks for it.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aotforge.artifacts.debris import make_temp_dir, make_temp_file, sweep
from aotforge.core.errors import AotforgeError, OptionsError

#: Scratch directories of tasks on a worker node (``<tmp>/aotforge-farm/.task-<host>.<pid>.*``).
TASK_PREFIX = ".task-"
#: A task whose worker died (killed, node lost) is run again this many times.
MAX_RETRIES = 3


def build_task(bundle_tar: bytes, bundle_sha256: str, job: Mapping[str, Any]) -> dict[str, Any]:
    """The Ray task: unpack the bundle, finish it in a scratch dir, return the artifact's tarball and outputs."""
    from aotforge.artifacts.packing import pack
    from aotforge.compiler.farm.worker import run_job

    if hashlib.sha256(bundle_tar).hexdigest() != bundle_sha256:
        return {"error": "ArtifactError", "message": "the bundle changed in transit (sha256 mismatch): run again"}
    root = Path(tempfile.gettempdir()) / "aotforge-farm"
    root.mkdir(parents=True, exist_ok=True)
    sweep(root, TASK_PREFIX)  # what tasks killed on this node left
    scratch = make_temp_dir(root, TASK_PREFIX)
    try:
        with tarfile.open(fileobj=io.BytesIO(bundle_tar), mode="r:gz") as tar:
            tar.extractall(scratch / "bundle", filter="data")
        worker = {**dict(job.get("worker") or {}), "executor": "ray", **_node()}
        outputs = scratch / "outputs.npz"
        here = {**job, "bundle": str(scratch / "bundle"), "out": str(scratch / "out"), "outputs": str(outputs)}
        result = run_job({**here, "cache_dir": None, "worker": worker})
        if "ok" not in result:
            return {**result, "message": f"{result['message']} (on {worker['host']}, node {worker['node'][:12]})"}
        artifact = pack(Path(result["ok"]["path"]), scratch / "artifact.tar.gz").read_bytes()
        return {
            "ok": {**result["ok"], "path": None, "outputs": None},
            "artifact": artifact,
            "artifact_sha256": hashlib.sha256(artifact).hexdigest(),
            "outputs": outputs.read_bytes(),
            "worker": worker,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _node() -> dict[str, str]:
    import socket

    import ray

    return {"host": socket.gethostname(), "node": ray.get_runtime_context().get_node_id()}


class RayExecutor:
    """Builds as Ray tasks on the cluster at ``address`` (``auto``, ``ray://host:10001``), or a local instance."""

    name = "ray"

    def __init__(self, address: str | None = None, *, init_options: Mapping[str, Any] | None = None) -> None:
        try:
            import ray
        except ImportError as e:
            raise OptionsError("--executor ray needs Ray: pip install 'aotforge[ray]'") from e
        self._ray = ray
        self.address = address
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(address=address or None, **{"include_dashboard": False, **dict(init_options or {})})
        self._task = ray.remote(build_task)
        self._collectors = ThreadPoolExecutor(32, thread_name_prefix="aotforge-ray")

    def describe(self) -> str:
        return f"ray ({self.address or 'local instance'}, {len(self._alive())} node(s))"

    def submit(self, job: dict[str, Any], work: Path, tag: str) -> Future[dict[str, Any]]:
        """Fails at once (no task) when no node offers every resource the target asks for."""
        need = dict(job.get("resources") or {"CPU": 1.0})
        missing = self.unserved(need)
        if missing:
            done: Future[dict[str, Any]] = Future()
            done.set_result({"error": "TargetUnavailableError", "message": f"{tag}: {missing}"})
            return done
        data, digest = _tar_bundle(Path(job["bundle"]))
        options: dict[str, Any] = {
            "num_cpus": need.pop("CPU", 1.0),
            "num_gpus": need.pop("GPU", 0.0),
            "resources": need,
            "max_retries": MAX_RETRIES,
            "retry_exceptions": False,  # a build error is an answer, not a lost worker
        }
        ref = self._task.options(**options).remote(data, digest, job)
        return self._collectors.submit(self._collect, ref, job)

    def unserved(self, need: Mapping[str, float]) -> str | None:
        """Why no alive node can run a task asking ``need`` (None when one can)."""
        nodes = self._alive()
        if any(all(n["Resources"].get(k, 0.0) >= v for k, v in need.items() if v) for n in nodes):
            return None
        for key, amount in need.items():
            if amount and not any(n["Resources"].get(key, 0.0) >= amount for n in nodes):
                offers = "; ".join(_offers(n) for n in nodes) or "no alive node"
                return f"no node offers {key}: {amount:g} needed, the cluster's nodes offer {offers}"
        return f"no single node offers all of {dict(need)}; the nodes offer {'; '.join(_offers(n) for n in nodes)}"

    def _alive(self) -> list[dict[str, Any]]:
        return [n for n in self._ray.nodes() if n.get("Alive")]

    def _collect(self, ref: Any, job: Mapping[str, Any]) -> dict[str, Any]:
        """The task's result: its tarball checked against its sha256, then unpacked (and verified) into ``out``."""
        from aotforge.artifacts.packing import unpack
        from aotforge.artifacts.store import artifact_path

        try:
            result: dict[str, Any] = self._ray.get(ref)
        except self._ray.exceptions.RayError as e:
            return {"error": "CompileError", "message": f"the Ray task failed after {MAX_RETRIES} retries: {e}"}
        if "ok" not in result:
            return result
        data = result["artifact"]
        if hashlib.sha256(data).hexdigest() != result["artifact_sha256"]:
            return {"error": "ArtifactError", "message": "the artifact tarball changed in transit: nothing stored"}
        out = Path(job["out"])
        final = artifact_path(out, job["model"], int(job["version"]), result["ok"]["manifest"]["target"]["name"])
        final.parent.mkdir(parents=True, exist_ok=True)
        tar = make_temp_file(final.parent, ".pack-", ".tar.gz")
        try:
            tar.write_bytes(data)
            unpack(tar, final)
        except AotforgeError as e:
            return {"error": type(e).__name__, "message": str(e)}
        finally:
            tar.unlink(missing_ok=True)
        Path(job["outputs"]).write_bytes(result["outputs"])
        return {"ok": {**result["ok"], "path": str(final), "outputs": job["outputs"]}}

    def close(self) -> None:
        self._collectors.shutdown(wait=True)
        if self._started:
            self._ray.shutdown()


def _offers(node: Mapping[str, Any]) -> str:
    res = {k: v for k, v in node["Resources"].items() if not k.startswith(("node:", "object_store", "memory"))}
    return f"{node.get('NodeManagerAddress', '?')} {{{', '.join(f'{k}: {v:g}' for k, v in sorted(res.items()))}}}"


def _tar_bundle(bundle: Path) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(bundle.rglob("*")):
            tar.add(path, arcname=path.relative_to(bundle).as_posix(), recursive=False)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()
