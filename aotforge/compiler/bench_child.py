"""The benchmark process ``compiler.bench`` starts: load one artifact, time it, write the figures.

``python -m aotforge.compiler.bench_child WORKDIR`` reads ``WORKDIR/request.json`` and writes
``WORKDIR/result.json``; an aotforge error is written there too (type and message), so the parent
raises the same error. Only the artifact's runtime is imported here, never torch or a compiler.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

#: Modules of a build process that must not be in the benchmark's figures.
BUILD_MODULES = ("torch", "onnxruntime.quantization", "transformers")


def main(work: Path) -> None:
    # No runtime needs torch to run an artifact, but tvm_ffi imports it when it can (~300 MB): blocked here,
    # ``import torch`` raises ImportError, which tvm_ffi (and any optional use) already handles.
    for name in ("torch", "transformers"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    from aotforge.compiler.benchmark import peak_rss_mb

    baseline = peak_rss_mb()  # the interpreter and aotforge, before the artifact's runtime loads
    request = json.loads((work / "request.json").read_text())
    try:
        result, times = _measure(request, baseline)
        out: dict[str, Any] = {
            "result": result,
            "times_ms": times,
            "build_modules": sorted(m for m in BUILD_MODULES if sys.modules.get(m) is not None),
        }
    except Exception as e:
        from aotforge.core.errors import AotforgeError

        if not isinstance(e, AotforgeError):
            raise
        out = {"error": {"type": type(e).__name__, "message": str(e)}}
    (work / "result.json").write_text(json.dumps(out))


def _measure(request: dict[str, Any], baseline: float) -> tuple[dict[str, Any], list[float]]:
    import numpy as np

    from aotforge.compiler.benchmark import BenchOptions, summarize, timed_runs
    from aotforge.core.runtime_threads import environment_threads

    runner = _load(Path(request["artifact"]), request.get("staged"), request["threads"])
    with np.load(request["inputs"]) as data:
        inputs = {k: data[k] for k in data.files}
    times = timed_runs(runner.run, inputs, BenchOptions(**request["options"]))
    # None asked: the count OMP_NUM_THREADS gives the runtime where it is set, so the record says what ran.
    threads = request["threads"] or environment_threads()
    result = summarize(times, batch=request["batch"], threads=threads, baseline_rss_mb=baseline)
    return dataclasses.asdict(result), [round(t * 1000.0, 4) for t in times]


def _load(path: Path, staged: dict[str, Any] | None, threads: int) -> Any:
    """The runner: a verified artifact's (``load`` checks every hash and this host), or a staged build's."""
    from aotforge.artifacts.loader import check_host
    from aotforge.artifacts.signing import verified_manifest
    from aotforge.core.errors import InputSpecError
    from aotforge.core.spec import IOSpec
    from aotforge.core.target_record import TargetRecord
    from aotforge.targets import get_target

    if staged is not None:
        record, io = TargetRecord.from_dict(staged["record"]), IOSpec.from_dict(staged["io"])
    else:
        manifest = verified_manifest(path)
        if manifest.target.info.get("task"):
            raise InputSpecError(
                f"{manifest.name} v{manifest.version} is a {manifest.target.info['task']} artifact: its build "
                "measured TTFT and inter-token latency (aotforge inspect); `aotforge bench` times one-call models"
            )
        check_host(manifest, get_target(manifest.target.name))
        record, io = manifest.target, IOSpec.from_dict(manifest.io)
    if threads and "intra_op_threads" in record.options:  # ORT's pool is set by its session options
        record = dataclasses.replace(record, options={**record.options, "intra_op_threads": threads})
    return get_target(record.name).load(path, record, io)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
