"""The one tail of every build: compile (through the cache) -> load -> validate -> benchmark -> manifest -> store.

``build`` (``compiler.builder``) and ``finish`` (``compiler.bundle``) both end in
:func:`compile_and_store`; a direct cache hit (``compiler.build_direct``) has nothing to compile
and ends in :func:`store_artifact` like they do. This module stays light (no onnx, no target
imported at module level): the direct hit goes through it.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.artifacts.card_plots import latency_plot, manifest_plots
from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.names import check_name, check_version
from aotforge.artifacts.store import MODEL_FILE, artifact_path, finalize, next_version
from aotforge.compiler.backend_stage import CALL, OUTPUTS, compiled_of, load_outputs, request_for
from aotforge.compiler.bench import bench_artifact
from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.compile_cache import compile_cached
from aotforge.compiler.isolation import Isolation, Worker, run_isolated, take_worker
from aotforge.compiler.source import Arrays
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.compiler.validation import validate
from aotforge.core.errors import InputSpecError
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult

if TYPE_CHECKING:
    import onnx_ir as ir

    from aotforge.targets.base import BuildContext, ProbeResult, Target

Progress = Callable[[str], None]
Outputs = list[Arrays] | None


@dataclasses.dataclass(frozen=True)
class ArtifactPlace:
    """Where an artifact will be stored: under ``out``, its name, the version hoped for and its target.

    Without an ``explicit`` version, ``version`` is only the next free one when the build started: the
    rename at the end claims the version (``artifacts.store.finalize``), and a concurrent build that got
    there first pushes this one to the next.
    """

    out: Path
    name: str
    version: int
    target: str
    explicit: bool
    #: Draw the model card's plots (``artifacts.card_plots``; ~1 s of matplotlib per build).
    plots: bool = True

    def path_of(self, manifest: Manifest) -> Path:
        """Where the stored artifact is (its version is the one its manifest says)."""
        return artifact_path(self.out, manifest.name, manifest.version, self.target)


def place_artifact(out: Path, name: str, version: int | None, target: str, *, plots: bool = True) -> ArtifactPlace:
    """The next version (or the one asked for) of ``name`` under ``out``; an existing explicit one is refused."""
    check_name(name, "--name")
    if version is not None:
        check_version(version, "--version")
        final = artifact_path(out, name, version, target)
        # Refused before the compile: an existing version costs the user no compile time.
        if final.exists():
            raise InputSpecError(f"{final} already exists: give another --version or leave it out to get the next one")
        return ArtifactPlace(out, name, version, target, explicit=True, plots=plots)
    return ArtifactPlace(out, name, next_version(out, name), target, explicit=False, plots=plots)


def build_record(started: float, **extra: Any) -> dict[str, Any]:
    """The manifest's ``build`` section: the only fields that differ between identical builds."""
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "host": socket.gethostname(),
        "machine": platform.machine(),
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **extra,
    }


def store_artifact(stage: Path, manifest: Manifest, place: ArtifactPlace) -> Manifest:
    """Name, version, model card, file hashes and the atomic rename into place."""
    manifest = dataclasses.replace(manifest, name=place.name, version=place.version)
    stored, _final = finalize(stage, manifest, place.out, explicit=place.explicit)
    return stored


def start_worker(target: Target, isolation: Isolation) -> Worker | None:
    """A worker for the backend stage, importing what it will need while the build does its own work."""
    if not isolation.enabled or target.compiles_torch_program:
        return None
    module = type(target).__module__
    return take_worker(isolation, ("aotforge.compiler.backend_stage", "onnx_ir", module, *target.worker_preload))


def key_toolchain(target: str, probe: ProbeResult) -> dict[str, str]:
    """The toolchain as the cache key records it: the target compiler's version is known only after
    compiling, so its probe details (version, host CPU ...) stand in for it."""
    return {**toolchain_versions(), **{f"{target}.{k}": str(v) for k, v in probe.details.items()}}


@dataclasses.dataclass(frozen=True)
class TailJob:
    """Everything the tail needs, whichever way the build got here (a build, or a bundle being finished)."""

    place: ArtifactPlace
    model: ir.Model
    target: Target
    target_options: Any
    ctx: BuildContext
    #: Validation inputs and what the source model computes on them.
    samples: Sequence[Arrays]
    reference: Callable[[Arrays], Arrays]
    #: The manifest's validation record so far (``compiler.validation.validation_plan``).
    validation: Mapping[str, Any]
    bench: BenchOptions | None
    batch: int
    source: Mapping[str, Any]
    passes: Sequence[Mapping[str, Any]]
    toolchain: Mapping[str, str]
    cache_dir: Path | None = None
    #: Extra fields of the manifest's ``build`` section (pass durations, the bundle it came from).
    build_extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Deadline and memory limit of the backend stages (the compile, a native artifact's first run).
    isolation: Isolation = Isolation()
    #: The isolated worker, started while the build loaded the model and ran the passes (its imports
    #: overlap that work); None starts one when the compile begins.
    worker: Worker | None = None


def _compile(job: TailJob, stage: Path, say: Progress) -> tuple[CompileResult, dict[str, Any] | None, Outputs]:
    """``compile_cached`` in this process, or (``isolation.enabled``) the compile and the validation runs
    in a spawned worker whose files land in ``stage`` (``compiler.backend_stage``); then the third
    value is the artifact's outputs on ``job.samples``, in their order."""
    if not job.isolation.enabled or job.target.compiles_torch_program:
        # A torch program does not cross to a worker; Neuron's SDK runs in its own worker process anyway.
        compiled, cache = compile_cached(
            job.target, job.model, job.target_options, job.ctx, stage, job.cache_dir, job.toolchain, job.passes, say
        )
        return compiled, cache, None
    with tempfile.TemporaryDirectory(prefix="aotforge-worker-") as handoff:
        request = request_for(
            job.target,
            options=job.target_options,
            ctx=dataclasses.replace(job.ctx, torch_program=None),
            stage=stage,
            cache_dir=job.cache_dir,
            toolchain=job.toolchain,
            passes=job.passes,
            samples=list(job.samples),
            outputs_dir=Path(handoff),
            run_deadline_s=job.isolation.run_deadline_s,
        )
        stage_name = f"the {job.target.name} compile"
        result = run_isolated(CALL, request, stage=stage_name, limits=job.isolation, say=say, worker=job.worker)
        outputs = load_outputs(Path(handoff) / OUTPUTS, result["outputs"])
    return compiled_of(result), result["cache"], outputs


def _replay(samples: Sequence[Arrays], outputs: Outputs) -> Callable[[Arrays], Arrays]:
    """The worker's outputs, answered by sample (validation asks for exactly these samples)."""
    by_id = {id(s): o for s, o in zip(samples, outputs or [], strict=True)}
    return lambda sample: by_id[id(sample)]


def compile_and_store(
    job: TailJob,
    stage: Path,
    started: float,
    say: Progress,
    before_store: Callable[[Manifest, dict[str, Any]], None] | None = None,
) -> Manifest:
    """Compile ``job.model`` into ``stage`` (which holds the IR as ``model.onnx``) and store the artifact.

    ``before_store(manifest, cache_record)`` runs once the manifest is complete, before the rename:
    the direct cache records its entry there (and notes the outcome in the cache record).
    """
    compiled, cache, outputs = _compile(job, stage, say)
    record = TargetRecord(job.target.name, dataclasses.asdict(job.target_options), dict(compiled.target_info))
    # Isolated, the artifact already ran every sample in the worker: this process never loads it
    # (the benchmark runs in a process of its own too).
    runner = job.target.load(stage, record, job.ctx.io) if outputs is None else None
    run = runner.run if runner is not None else _replay(job.samples, outputs)
    say("validating against the source model")
    validation = validate(job.reference, run, job.samples, job.validation, model=job.place.name, target=job.target.name)
    del runner, run  # its thread pool would spin beside the benchmark process
    bench = None
    if job.bench is not None:
        say("benchmarking (in a process of its own)")
        (timed,) = bench_artifact(
            stage, job.samples[0], batch=job.batch, options=job.bench, staged=(record, job.ctx.io)
        )
        bench = timed.result
        if job.place.plots:
            latency_plot(stage, timed.times_ms, bench)
    manifest = Manifest(
        name=job.place.name,
        version=job.place.version,
        target=record,
        toolchain={**toolchain_versions(), **compiled.toolchain},
        source=dict(job.source),
        ir={"sha256": sha256_file(stage / MODEL_FILE), "opset": job.model.opset_imports.get("", 0)},
        passes=[dict(p) for p in job.passes],
        io=job.ctx.io.to_dict(),
        validation=validation,
        benchmark=bench,
        files={},
        build=build_record(started, **job.build_extra, **({"cache": cache} if cache is not None else {})),
    )
    if job.place.plots:  # before before_store: the direct cache keeps them for its hits
        manifest_plots(stage, validation, bench, job.passes)
    if before_store is not None and cache is not None:
        before_store(manifest, cache)
    say("writing the artifact (model card, plots, hashes)")
    return store_artifact(stage, manifest, job.place)
