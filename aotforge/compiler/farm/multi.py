"""``compile --target tvm,onnxruntime`` / ``build(..., target=[...])``: one model, several targets.

The frontend and the passes run once, in this process (``compiler.farm.prepare``); each target's
compile, validation and benchmark run in a worker process of their own (``compiler.farm.executors``),
one target after another by default so that no benchmark shares the cores with another build. All
targets get one version; the comparison lands beside their artifacts, in ``OUT/NAME/VERSION/``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts.debris import make_temp_dir, sweep
from aotforge.compiler.farm import report
from aotforge.compiler.farm.executors import LocalExecutor
from aotforge.compiler.farm.prepare import Prepared, prepare
from aotforge.compiler.farm.spec import MatrixResult, parse_targets
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import TEXT_GENERATION
from aotforge.core.errors import OptionsError
from aotforge.targets import get_target

Progress = Callable[[str], None]
#: The farm's scratch directories under ``out`` (bundles, worker logs), swept when their owner is gone.
WORK_PREFIX = ".farm-"


def resolve_targets(spec: str | Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The targets to build and (for ``all``) those left out with their probe's reason."""
    names = parse_targets(spec)
    if not (isinstance(spec, str) and spec.strip() == "all"):
        return names, {}
    wanted, skipped = [], {}
    for name in names:
        probe = get_target(name).probe()
        if probe.compiles:
            wanted.append(name)
        else:
            skipped[name] = probe.reason
    return wanted, skipped


def build_many(
    model: Any,
    opts: BuildOptions,
    targets: str | Sequence[str],
    *,
    example_inputs: Mapping[str, Any] | None = None,
    jobs: int = 1,
    progress: Progress | None = None,
) -> MatrixResult:
    """Build ``model`` for every target in ``targets``; a failed target fails its row, after the others finished."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    if opts.prepare_only or opts.frontend.task == TEXT_GENERATION:
        what = "--prepare-only" if opts.prepare_only else "--task text-generation"
        raise OptionsError(f"{what} builds one target at a time: give one --target")
    wanted, skipped = resolve_targets(targets)
    opts.out.mkdir(parents=True, exist_ok=True)
    sweep(opts.out, WORK_PREFIX)
    work = make_temp_dir(opts.out, WORK_PREFIX)
    try:
        prep = prepare(model, opts, wanted, work / "bundles", example_inputs=example_inputs, progress=say)
        rows, outputs = _build_all(prep, opts, wanted, work, jobs, say)
        pairs = report.agreement(outputs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.fill_agreement(rows, pairs)
    name = prep.name or opts.name or "model"
    summary = {
        "rows": rows,
        "agreement": {name: pairs},
        "skipped": skipped,
        "prepare_seconds": {name: prep.seconds},
        "ir_sha256": {name: prep.ir_sha256},
        "executor": f"local, {jobs} worker process(es) at a time",
        "seconds": round(time.perf_counter() - started, 2),
    }
    where = opts.out / name / str(prep.version) if prep.version else opts.out
    return MatrixResult(rows, {name: pairs}, report.write(where, summary), skipped)


def _build_all(
    prep: Prepared, opts: BuildOptions, wanted: Sequence[str], work: Path, jobs: int, say: Progress
) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    name = prep.name or opts.name or "model"
    rows: dict[str, dict[str, Any]] = {t: report.failed_row(name, t, why) for t, why in prep.failed.items()}
    outputs: dict[str, Path] = {}
    with LocalExecutor(jobs) as pool:
        futures = {}
        for target, bundle in prep.bundles.items():
            job = finish_job(bundle, opts.out, work / f"{target}.outputs.npz", opts.cache_dir, opts.benchmark.bench)
            futures[target] = pool.submit(job, work, target)
        for target, future in futures.items():
            say(f"{target}: compiling, validating and benchmarking in a worker process")
            result = future.result()
            if "ok" not in result:
                rows[target] = report.failed_row(name, target, result["message"])
                continue
            done = result["ok"]
            rows[target] = report.artifact_row(name, target, Path(done["path"]), done["manifest"], cached=False)
            outputs[target] = Path(done["outputs"])
    return [rows[t] for t in wanted if t in rows], outputs


def finish_job(
    bundle: Path, out: Path, outputs: Path, cache_dir: Path | None, bench: bool | None, executor: str = "local"
) -> dict[str, Any]:
    """A worker's job: finish ``bundle`` into ``out``, its outputs on the validation inputs into ``outputs``."""
    return {
        "kind": "finish",
        "bundle": str(bundle),
        "out": str(out),
        "outputs": str(outputs),
        "cache_dir": str(cache_dir) if cache_dir else None,
        "bench": None if bench else False,
        "worker": {"executor": executor},
    }
