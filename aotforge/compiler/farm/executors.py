"""The local executor: every job in its own exec'd worker interpreter, up to ``jobs`` at a time.

The pool's threads only wait on child processes; a worker that segfaults, is killed or runs out of
memory fails its own job (its signal named), and its pool slot goes on to the next job. Workers are
started by exec (``subprocess``), never as a fork of this process: a fork of a process that runs
torch / ONNX Runtime thread pools deadlocked once (``compiler.isolation``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: A worker's memory need assumed when sizing the pool (a tvm compile of a BERT-sized model).
WORKER_MEMORY_BYTES = 4 << 30


def default_jobs() -> int:
    """Workers for this host: one per core, as many as its available memory holds (MemAvailable: page
    cache counts as available; plain free memory made a 24 GiB host with a warm cache look full)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return max(1, min(cores, (int(line.split()[1]) << 10) // WORKER_MEMORY_BYTES))
    except (OSError, ValueError, IndexError):
        pass
    return cores


def run_worker(job: Mapping[str, Any], work: Path, tag: str, deadline_s: float = 24 * 3600.0) -> dict[str, Any]:
    """``job`` in ``python -m aotforge.compiler.farm.worker``; its result, or the error its death is."""
    work.mkdir(parents=True, exist_ok=True)
    request, result, log = (work / f"{tag}.{kind}" for kind in ("job.json", "result.json", "log"))
    request.write_text(json.dumps({**job, "parent_pid": os.getpid()}, default=str))
    command = [sys.executable, "-m", "aotforge.compiler.farm.worker", str(request), str(result)]
    with log.open("wb") as out:
        # Its own session: a deadline stops the compilers it started too.
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"error": "CompileError", "message": f"{tag}: the worker ran past {deadline_s:g} s and was stopped"}
    if result.is_file():
        data: dict[str, Any] = json.loads(result.read_text())
        return data
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        how = f"crashed with {name}"
    else:
        how = f"exited with code {code} and no result"
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    return {
        "error": "CompileError",
        "message": f"{tag}: the worker {how} (nothing was stored; its log ends: {tail[0][:300]})",
    }


class LocalExecutor:
    """Jobs in worker processes on this host, ``jobs`` at a time."""

    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = jobs or default_jobs()
        self._pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="aotforge-worker")

    def submit(self, job: Mapping[str, Any], work: Path, tag: str) -> Future[dict[str, Any]]:
        return self._pool.submit(run_worker, job, work, tag)

    def describe(self) -> str:
        return f"local, {self.jobs} worker process(es) at a time"

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
