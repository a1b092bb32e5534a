"""Benchmark an artifact in a process of its own: ``aotforge bench`` and every build's benchmark.

The parent picks the inputs (a ``.npz`` of the user's, else seeded ones at the dims' ``opt`` sizes,
with ``--batch`` replacing the batch dim) and starts one fresh interpreter per thread count
(``python -m aotforge.compiler.bench_child``): that child imports only the artifact's runtime, loads
the artifact, warms it up and times it (``compiler.benchmark``), and reports percentiles, std,
throughput and its own peak memory. Nothing of the build process (torch, TVM's compiler, the source
model, spinning thread pools) is in the figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.source import Arrays
from aotforge.core import errors
from aotforge.core.errors import AotforgeError, ArtifactError, InputSpecError
from aotforge.core.spec import IOSpec
from aotforge.core.target_record import TargetRecord
from aotforge.targets.tvm.threads import THREAD_VARIABLES  # tvm's pool reads them (ORT's comes through its options)


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """One child's report: the figures (``BenchResult`` as a dict) and every timed call in ms."""

    result: dict[str, Any]
    times_ms: list[float]
    #: Heavy build-time modules found loaded in the child (should be none).
    build_modules: list[str]


def bench_inputs(io: IOSpec, *, inputs_file: Path | None = None, batch: int | None = None) -> tuple[Arrays, int]:
    """The inputs to time and their batch size: the file's first sample, or seeded ones at opt sizes."""
    from aotforge.compiler.sample_inputs import make_inputs

    batch_dims = [d.name for d in io.dims if d.kind == "batch" or d.name == "batch"]
    if inputs_file is not None:
        if batch is not None:
            raise InputSpecError("--batch sizes generated inputs; with --inputs, the file's arrays give the batch")
        from aotforge.compiler.sample_files import read_samples

        inputs = read_samples(Path(inputs_file), io)[0]
        sizes = io.sizes_of({k: np.shape(v) for k, v in inputs.items()}, who="the benchmark inputs")
        return inputs, int(sizes.get(batch_dims[0], 1)) if batch_dims else 1
    sizes = io.bound_sizes("opt")
    if batch is not None:
        if not batch_dims:
            raise InputSpecError(
                f"--batch {batch}: the artifact has no dynamic batch dim ({io.accepted()}): leave --batch out"
            )
        sizes = {**sizes, **{d: batch for d in batch_dims}}
    inputs = make_inputs(io, sizes, seed=0, count=1)[0]
    io.sizes_of({k: v.shape for k, v in inputs.items()}, who="the artifact")  # a batch outside its range
    return inputs, int(sizes[batch_dims[0]]) if batch_dims else 1


def bench_artifact(
    path: Path,
    inputs: Arrays,
    *,
    batch: int,
    options: BenchOptions,
    threads: Sequence[int] = (0,),
    staged: tuple[TargetRecord, IOSpec] | None = None,
) -> list[BenchRun]:
    """Time the artifact at ``path`` on ``inputs`` once per thread count, each in a fresh process.

    ``staged`` (record, io) benchmarks a build's staging directory, which has no manifest yet (the
    build just wrote and validated its files); otherwise the child verifies the artifact first.
    """
    with tempfile.TemporaryDirectory(prefix="aotforge-bench-") as tmp:
        work = Path(tmp)
        np.savez(work / "inputs.npz", **inputs)  # type: ignore[arg-type]
        request: dict[str, Any] = {
            "artifact": str(path),
            "inputs": str(work / "inputs.npz"),
            "batch": batch,
            "options": dataclasses.asdict(options),
        }
        if staged is not None:
            request["staged"] = {"record": dataclasses.asdict(staged[0]), "io": staged[1].to_dict()}
        return [_run_child(work, {**request, "threads": n}) for n in threads]


def _run_child(work: Path, request: Mapping[str, Any]) -> BenchRun:
    (work / "request.json").write_text(json.dumps(request))
    result_file = work / "result.json"
    result_file.unlink(missing_ok=True)
    env = dict(os.environ)
    # The same aotforge as this process, whatever the child's working directory and site-packages say.
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    if request["threads"]:
        env.update({k: str(request["threads"]) for k in THREAD_VARIABLES})
    proc = subprocess.run(
        [sys.executable, "-m", "aotforge.compiler.bench_child", str(work)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if not result_file.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ArtifactError(
            f"the benchmark process of {request['artifact']} ended (exit {proc.returncode}) without a result: "
            f"{' | '.join(tail) or 'no output'}; run `aotforge bench` on it with --debug to see more"
        )
    data = json.loads(result_file.read_text())
    if "error" in data:
        cls = getattr(errors, data["error"]["type"], AotforgeError)
        raise (cls if isinstance(cls, type) and issubclass(cls, AotforgeError) else AotforgeError)(
            data["error"]["message"]
        )
    return BenchRun(data["result"], data["times_ms"], data["build_modules"])


def parse_threads(text: str) -> tuple[int, ...]:
    """``--threads 1,2,4`` -> (1, 2, 4); each a positive int."""
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise InputSpecError(f"--threads {text!r}: give positive thread counts, e.g. 1 or 1,2,4")
    return values
