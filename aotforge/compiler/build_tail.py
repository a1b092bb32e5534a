"""The one tail of every build: compile (through the cache) -> load -> validate -> benchmark -> manifest -> store.

Every build ends in :func:`compile_and_store`: an encoder's (``compiler.builder``), a text-generation one's
(``compiler.generative.build``), each target of a multi-target build and every bundle finished
(``compiler.bundle``, ``compiler.generative.bundle_finish``). What differs between the tasks is a
:class:`TailWork` (``compiler.encoder_work``, ``compiler.generative.decoder_work``): how the target compiles
the staged IR, how the artifact is checked against its source and timed. :func:`make_manifest` is the one place a
``Manifest`` is made: the tail's, a bundle's draft and a direct cache hit's all come from it. A direct cache hit
(``compiler.build_direct``) has nothing to compile and ends in :func:`store_artifact` like the tail does. This
module stays light (no onnx, no target imported at module level): the direct hit goes through it.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aotforge.artifacts.card_plots import manifest_plots
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.names import check_name, check_version
from aotforge.artifacts.store import artifact_path, finalize, next_version
from aotforge.compiler.isolation import Isolation, Worker, take_worker
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.core.errors import InputSpecError
from aotforge.core.target_record import TargetRecord

if TYPE_CHECKING:
    from aotforge.compiler.compile_cache import CacheKey
    from aotforge.targets.base import CompileResult, ProbeResult, Target

Progress = Callable[[str], None]


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


def start_worker(target: Target, isolation: Isolation, preload: Sequence[str] | None = None) -> Worker | None:
    """A worker for the backend stage, importing what it will need while the build does its own work.

    ``preload``: the modules of the stage's entry (default: the encoder's, ``compiler.backend_stage``)."""
    if not isolation.enabled or target.compiles_torch_program:
        return None
    module = type(target).__module__
    entry = ("aotforge.compiler.backend_stage", "onnx_ir") if preload is None else tuple(preload)
    return take_worker(isolation, (*entry, module, *target.worker_preload))


def key_toolchain(target: str, probe: ProbeResult) -> dict[str, str]:
    """The toolchain as the cache key records it: the target compiler's version is known only after
    compiling, so its probe details (version, host CPU ...) stand in for it."""
    return {**toolchain_versions(), **{f"{target}.{k}": str(v) for k, v in probe.details.items()}}


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the compile step gives the rest of the tail."""

    result: CompileResult
    #: The manifest's ``build.cache`` record (None without ``--cache-dir``).
    cache: dict[str, Any] | None
    #: An isolated worker's outputs of the compiled artifact on the validation inputs (None: not run there).
    outputs: list[Any] | None = None


@dataclasses.dataclass(frozen=True)
class Checked:
    """What checking the artifact against its source gives the manifest."""

    validation: dict[str, Any]
    benchmark: dict[str, Any] | None


class TailWork(Protocol):
    """What one task compiles and how it checks the result: all the tail leaves to the task."""

    #: The staged files the compile reads and which others the cache keeps (``compiler.compile_cache``).
    def cache_key(self, toolchain: Mapping[str, str], passes: Sequence[Mapping[str, Any]]) -> CacheKey: ...

    def compile(self, job: TailJob, stage: Path, say: Progress) -> Compiled:
        """The target's compile of the staged IR (through ``compile_cached``, isolated where the task can be)."""
        ...

    def target_info(self, stage: Path, compiled: CompileResult) -> dict[str, Any]:
        """The manifest's ``target.info``: the compile's, with what the task adds."""
        ...

    def extra_passes(self, compiled: CompileResult) -> list[dict[str, Any]]:
        """Entries of passes the target applied itself while compiling (the manifest lists them after the rest)."""
        ...

    def check(self, job: TailJob, stage: Path, record: TargetRecord, compiled: Compiled, say: Progress) -> Checked:
        """Load, validate against the source (or the references a bundle carries), benchmark."""
        ...

    def ir_record(self, stage: Path) -> dict[str, Any]:
        """The manifest's ``ir``: sha256 and opset of what the target compiled."""
        ...

    def io_record(self) -> dict[str, Any]:
        """The manifest's ``io``."""
        ...


@dataclasses.dataclass(frozen=True)
class TailJob:
    """Everything the tail needs, whichever way the build got here (a build, or a bundle being finished)."""

    place: ArtifactPlace
    target: Target
    target_options: Any
    work: TailWork
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


def make_manifest(
    name: str,
    version: int,
    target: TargetRecord,
    *,
    toolchain: Mapping[str, str],
    source: Mapping[str, Any],
    ir: Mapping[str, Any],
    passes: Sequence[Mapping[str, Any]],
    io: Mapping[str, Any],
    validation: Mapping[str, Any],
    benchmark: Mapping[str, Any] | None,
    build: Mapping[str, Any],
) -> Manifest:
    """The one place a manifest is made (the tail's, a bundle's draft); ``files`` are filled when it is stored."""
    return Manifest(
        name=name,
        version=version,
        target=target,
        toolchain={**toolchain_versions(), **toolchain},
        source=dict(source),
        ir=dict(ir),
        passes=[dict(p) for p in passes],
        io=dict(io),
        validation=dict(validation),
        benchmark=dict(benchmark) if benchmark is not None else None,
        files={},
        build=dict(build),
    )


def pending_manifest(
    bundle: Path,
    name: str,
    version: int | None,
    target: TargetRecord,
    *,
    source: Mapping[str, Any],
    ir: Mapping[str, Any],
    passes: Sequence[Mapping[str, Any]],
    io: Mapping[str, Any],
    validation: Mapping[str, Any],
) -> Manifest:
    """The draft a ``--prepare-only`` build returns for ``bundle``: nothing compiled yet, its validation pending."""
    return make_manifest(
        name,
        version or 0,
        target,
        toolchain={},
        source=source,
        ir=ir,
        passes=passes,
        io=io,
        validation={**validation, "passed": False, "pending": "aotforge finish"},
        benchmark=None,
        build={"bundle": str(bundle)},
    )


def compile_and_store(
    job: TailJob,
    stage: Path,
    started: float,
    say: Progress,
    before_store: Callable[[Manifest, dict[str, Any]], None] | None = None,
) -> Manifest:
    """Compile the IR staged in ``stage`` and store the artifact: the one tail of every build.

    ``before_store(manifest, cache_record)`` runs once the manifest is complete, before the rename:
    the direct cache records its entry there (and notes the outcome in the cache record).
    """
    compiled = job.work.compile(job, stage, say)
    info = job.work.target_info(stage, compiled.result)
    record = TargetRecord(job.target.name, dataclasses.asdict(job.target_options), info)
    checked = job.work.check(job, stage, record, compiled, say)
    cache = compiled.cache
    manifest = make_manifest(
        job.place.name,
        job.place.version,
        record,
        toolchain=compiled.result.toolchain,
        source=job.source,
        ir=job.work.ir_record(stage),
        passes=[*job.passes, *job.work.extra_passes(compiled.result)],
        io=job.work.io_record(),
        validation=checked.validation,
        benchmark=checked.benchmark,
        build=build_record(started, **job.build_extra, **({"cache": cache} if cache is not None else {})),
    )
    if job.place.plots:  # before before_store: the direct cache keeps them for its hits
        manifest_plots(stage, manifest.validation, manifest.benchmark, manifest.passes)
    if before_store is not None and cache is not None:
        before_store(manifest, cache)
    say("writing the artifact (model card, plots, hashes)")
    return store_artifact(stage, manifest, job.place)
