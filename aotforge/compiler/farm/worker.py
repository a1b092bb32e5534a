"""One target's compile, validation and benchmark of a build bundle, in a fresh interpreter or a Ray task.

A job is a JSON-able dict: the bundle, where the artifact goes, the cache directory and what the
worker is (executor, node). The worker finishes the bundle through the one build tail
(``compiler.bundle.finish``), then runs the stored artifact on the bundle's validation inputs so
that the artifacts of every target can be compared on the same inputs (``compiler.farm.report``).
Its result is JSON too: ``{"ok": ...}`` or ``{"error": kind, "message": ...}``.

``python -m aotforge.compiler.farm.worker JOB.json RESULT.json`` is how the local executor runs it:
an exec'd interpreter, never a fork of a process that already runs torch / ONNX Runtime threads (a
forked child deadlocked on a lock such a thread held, see ``compiler.isolation``).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: Where a worker writes the outputs of its artifact on the validation inputs (beside its result).
OUTPUTS_SUFFIX = ".outputs.npz"


def run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """Finish ``job["bundle"]`` into ``job["out"]``; the artifact's path, manifest and outputs file, or the error."""
    from aotforge.core.errors import AotforgeError, describe

    started = time.perf_counter()
    try:
        work = _prepare if job.get("kind") == "prepare" else _finish
        return {"ok": work(job), "seconds": round(time.perf_counter() - started, 2)}
    except AotforgeError as e:
        return {"error": type(e).__name__, "message": str(e)}
    except Exception as e:  # the backend's own exception: one row fails, not the farm
        return {"error": "CompileError", "message": f"{type(e).__name__} inside the backend: {describe(e)}"}


def _finish(job: Mapping[str, Any]) -> dict[str, Any]:
    from aotforge.artifacts.loader import load
    from aotforge.compiler.bundle import VALIDATION_NPZ, finish, read_bundle

    bundle = Path(job["bundle"])
    worker = {**dict(job.get("worker") or {}), "host": socket.gethostname()}
    cache_dir = Path(job["cache_dir"]) if job.get("cache_dir") else None
    result = finish(bundle, Path(job["out"]), bench=job.get("bench"), cache_dir=cache_dir, worker=worker)
    # The stored artifact, loaded as a user would: what the agreement between targets is measured on.
    runner = load(result.path)
    index = read_bundle(bundle)["validation_index"]
    outputs: dict[str, np.ndarray] = {}
    with np.load(bundle / VALIDATION_NPZ, allow_pickle=False) as data:
        for i, entry in enumerate(index):
            sample = {name: data[key] for name, key in entry["inputs"].items()}
            for j, value in enumerate(runner.run(sample).values()):
                outputs[f"s{i}_{j}"] = np.asarray(value)  # npz keys are file names: never the tensor's own name
    out_file = Path(job["outputs"])
    np.savez(out_file, **outputs)  # type: ignore[arg-type]
    return {"path": str(result.path), "manifest": result.manifest.to_dict(), "outputs": str(out_file)}


def _prepare(job: Mapping[str, Any]) -> dict[str, Any]:
    """A plan entry's frontend and passes once, and a bundle per target (``compiler.farm.prepare``)."""
    from aotforge.compiler.farm.prepare import prepare
    from aotforge.compiler.options import BuildOptions

    opts = BuildOptions.from_dict(job["options"])
    done = prepare(job["model"], opts, job["targets"], Path(job["bundle_root"]), probe_here=job["probe_here"])
    return done.to_dict()


def _die_with_parent(parent: int | None) -> None:
    """SIGKILL this worker when the build that started it dies (Linux), and exit if it already has."""
    import ctypes
    import os
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(args[0]).read_text())
    _die_with_parent(job.get("parent_pid"))
    result = run_job(job)
    tmp = Path(args[1] + ".tmp")
    tmp.write_text(json.dumps(result, default=str))
    tmp.replace(args[1])  # a result file is whole or absent
    return 0


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")  # the exporters' deprecation chatter is not the worker's result
    sys.exit(main())
