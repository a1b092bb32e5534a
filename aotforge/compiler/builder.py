"""The build line: source model -> IR -> passes -> the build tail (compile, validate, benchmark, store).

``build_resolved`` is one straight line of named steps; each says why it sits where it does. The
direct cache lookup happens before it (``compiler.api``), the tail after it (``compiler.build_tail``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.names import safe_name
from aotforge.artifacts.store import MODEL_FILE, staging_dir
from aotforge.compiler import read_tracker
from aotforge.compiler.build_direct import DirectPlan
from aotforge.compiler.build_direct import remember as remember_direct
from aotforge.compiler.build_plan import PlannedBuild
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import TailJob, compile_and_store, key_toolchain, place_artifact, start_worker
from aotforge.compiler.bundle import prepare_bundle
from aotforge.compiler.encoder_work import EncoderWork
from aotforge.compiler.frontend_onnx import load_onnx
from aotforge.compiler.frontend_torch import load_torch_file, load_torch_module
from aotforge.compiler.frontend_transformers import load_transformers_dir
from aotforge.compiler.isolation import Isolation, Worker
from aotforge.compiler.model_checks import check_compares_something, check_io
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.recipe import int8_shortcuts
from aotforge.compiler.sample_inputs import validation_inputs
from aotforge.compiler.source import SourceModel
from aotforge.compiler.validation import validation_plan
from aotforge.core.dim_defaults import resolve_dims
from aotforge.core.errors import InputSpecError, OptionsError, TargetUnavailableError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import DimRange, IOSpec, check_dims_used
from aotforge.passes import contrib_op_passes, expand, make_pass
from aotforge.passes.base import GraphPass
from aotforge.passes.manager import run_passes
from aotforge.targets import get_target
from aotforge.targets.base import BuildContext, Target

Progress = Callable[[str], None]

__all__ = ["LoadedSource", "PlannedBuild", "build_resolved", "load_and_sample", "plan_and_transform", "target_passes"]


def build_resolved(
    model: Any,
    opts: BuildOptions,
    *,
    example_inputs: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    direct: DirectPlan | None = None,
) -> BuildResult:
    """``build`` with resolved options, after the direct cache (``compiler.build_direct``) missed."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    direct = direct or DirectPlan(None, "not planned")
    with contextlib.ExitStack() as resources:
        # The backend stage's worker starts now: its imports overlap loading, validating and transforming.
        worker = None if opts.prepare_only else _worker(opts)
        if worker is not None:
            resources.enter_context(worker)
        # Everything up to the IR after passes is what direct mode skips: record the files it reads.
        with read_tracker.recording(enabled=direct.key is not None) as reads:
            planned = plan_and_transform(model, opts, example_inputs, say)
        name = opts.name or safe_name(planned.source.name)
        if opts.prepare_only:
            return prepare_bundle(planned, opts, name)
        # Placed before the compile: an existing version costs the user no compile time.
        place = place_artifact(opts.out, name, opts.version, opts.target, plots=opts.benchmark.plots)
        return _compile_and_store(planned, opts, place, worker, direct, reads, started, say)


def _compile_and_store(
    planned: PlannedBuild,
    opts: BuildOptions,
    place: Any,
    worker: Worker | None,
    direct: DirectPlan,
    reads: Any,
    started: float,
    say: Progress,
) -> BuildResult:
    with staging_dir(opts.out) as stage:
        ir.save(planned.source.ir, stage / MODEL_FILE)
        _copy_source_files(planned.source, stage)
        job = dataclasses.replace(tail_job(planned, opts, place), worker=worker)

        def remember(manifest: Manifest, cache: dict[str, Any]) -> None:
            if direct.key is not None:
                remember_direct(direct, reads, cache["key"], manifest, planned.source.name, opts, stage)
                cache["direct"] = direct.reason

        manifest = compile_and_store(job, stage, started, say, before_store=remember)
    return BuildResult(place.path_of(manifest), manifest)


def plan_and_transform(
    model: Any, opts: BuildOptions, example_inputs: Mapping[str, Any] | None, say: Progress
) -> PlannedBuild:
    """Refuse early what cannot be built, load the source, draw validation inputs, run the passes."""
    # Target first: an unavailable target or a bad option should cost the user nothing.
    target = get_target(opts.target)
    probe = target.probe()
    # A --prepare-only build stops before the compile, so the host need not have the target.
    if not probe.compiles and not opts.prepare_only:
        raise TargetUnavailableError(f"target {opts.target} is not available on this host: {probe.reason}")
    target_opts = options_from_dict(target.options_type, opts.target_options, what=opts.target)
    pass_names, graph_passes = target_passes(opts, target)
    loaded = load_and_sample(model, opts, example_inputs, say)
    ctx = build_context(loaded, pass_names)
    target.plan(loaded.source.ir, target_opts, ctx)
    say(f"running passes: {', '.join(pass_names) or 'none'}")
    records = run_passes(loaded.source.ir, graph_passes, opts.passes.dump_ir)
    return PlannedBuild(
        loaded.source, target, probe, target_opts, ctx, loaded.samples, loaded.sizes, records, loaded.record
    )


@dataclasses.dataclass(frozen=True)
class LoadedSource:
    """The source model with its resolved IO spec and validation inputs: what every target of a build shares."""

    source: SourceModel
    io: IOSpec
    samples: list[Any]
    sizes: Mapping[str, int]
    record: Mapping[str, Any]


def load_and_sample(
    model: Any, opts: BuildOptions, example_inputs: Mapping[str, Any] | None, say: Progress
) -> LoadedSource:
    """The frontend and the validation inputs: the target-independent start of every build."""
    say("loading model")
    source = _load(model, opts, example_inputs)
    io = dataclasses.replace(source.io, dims=_declared_dims(source.io, opts))
    check_dims_used(opts.frontend.dynamic, io)
    examples = {k: v.shape for k, v in (source.example_inputs or {}).items()}
    if opts.validation.sample_inputs is None:
        # Every symbolic dim gets a range (--dynamic, else a documented default), never a silent 1.
        io = resolve_dims(io, io.dims, examples)
        # Declared shapes no input can have (negative, terabytes) before any input is drawn.
        check_io(io, io.bound_sizes("max"), source.name)
    # Validation inputs before the passes, so every build of a model sees the same ones, and before
    # the target plans: sample inputs bind the dims no --dynamic names, and a source model that
    # rejects its inputs fails here, before any compile (compiler.sample_inputs).
    chosen = validation_inputs(
        io,
        opts.validation.sample_inputs,
        source.reference,
        seed=opts.validation.seed,
        count=opts.validation.validation_samples,
    )
    if chosen.record["source"] == "generated":  # the user's own data may produce empty outputs: shapes still compare
        check_compares_something(chosen.samples, chosen.reference, source.name)
    # The reference now answers the validation samples from the outputs computed while checking them.
    source = dataclasses.replace(source, reference=chosen.reference)
    # Dims the samples bound get their kind (targets pad or split by it); nothing is left unranged.
    io = resolve_dims(chosen.io, chosen.io.dims, examples)
    if opts.validation.sample_inputs is not None:
        check_io(io, io.bound_sizes("opt"), source.name)
    return LoadedSource(source, io, chosen.samples, chosen.sizes, chosen.record)


def build_context(loaded: LoadedSource, pass_names: tuple[str, ...]) -> BuildContext:
    return BuildContext(
        io=loaded.io,
        passes=pass_names,
        source_format=loaded.source.format,
        torch_program=loaded.source.torch_program,
        contrib_passes=contrib_op_passes(pass_names),
    )


def _worker(opts: BuildOptions) -> Worker | None:
    try:
        target = get_target(opts.target)
    except OptionsError:
        return None  # plan_and_transform names the unknown target
    return start_worker(target, isolation_of(opts))


def isolation_of(opts: BuildOptions) -> Isolation:
    return opts.isolation.limits()


def tail_job(planned: PlannedBuild, opts: BuildOptions, place: Any) -> TailJob:
    source = planned.source
    work = EncoderWork(
        model=source.ir,
        ctx=planned.ctx,
        samples=planned.samples,
        reference=source.reference,
        validation=validation_plan(
            source.format,
            opts.validation.tolerance,
            planned.samples,
            opts.validation.seed,
            planned.sizes,
            planned.inputs,
        ),
        bench=opts.benchmark.runs if opts.benchmark.bench else None,
        batch=int(planned.sizes.get("batch", 1)),
    )
    return TailJob(
        place=place,
        target=planned.target,
        target_options=planned.target_options,
        work=work,
        source={"format": source.format, "sha256": source.sha256, **source.details},
        passes=planned.pass_entries,
        toolchain=key_toolchain(opts.target, planned.probe),
        cache_dir=opts.cache_dir,
        isolation=isolation_of(opts),
        build_extra={"pass_seconds": {f"{i + 1}:{r.name}": r.seconds for i, r in enumerate(planned.records)}},
    )


def target_passes(
    opts: BuildOptions, target: Target, defaults: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[tuple[str, ...], list[GraphPass]]:
    """The pass names (presets expanded) and the passes, with the target's pass defaults (and ``defaults``, a
    text-generation backend's, over them) under the user's."""
    pass_names = expand(list(opts.passes.names))
    stray = sorted(set(opts.passes.params) - set(pass_names))
    if stray:
        raise OptionsError(
            f"parameters given for pass(es) {', '.join(stray)} that are not in --passes {','.join(pass_names)}"
        )
    pass_params = int8_shortcuts(opts.passes, pass_names)
    # A target may need other pass defaults (TensorRT: signed symmetric Q/DQ); the user's win.
    for pass_name in pass_names:
        layered = {**target.pass_defaults.get(pass_name, {}), **(defaults or {}).get(pass_name, {})}
        if layered:
            pass_params[pass_name] = {**layered, **pass_params.get(pass_name, {})}
    return pass_names, [make_pass(n, pass_params.get(n)) for n in pass_names]


def _load(model: Any, opts: BuildOptions, example_inputs: Mapping[str, Any] | None) -> SourceModel:
    if isinstance(model, (str, Path)):
        text = str(model)
        if Path(text).is_dir():
            return load_transformers_dir(
                Path(text), opts.frontend.task, opts.frontend.dynamic, opts.frontend.input_ranges
            )
        if opts.frontend.task is not None:
            raise OptionsError(
                f"task {opts.frontend.task.value} is for a transformers model directory; {text} is not one"
            )
        if text.endswith(".onnx"):
            return load_onnx(Path(text), opts.frontend.input_ranges, run_deadline_s=opts.isolation.run_deadline_s)
        return load_torch_file(text, opts.frontend.dynamic, opts.frontend.input_ranges)
    if example_inputs is None:
        raise InputSpecError("build() of an nn.Module needs example_inputs={name: tensor, ...}")
    return load_torch_module(
        model,
        example_inputs,
        name=opts.name or type(model).__name__.lower(),
        dims=opts.frontend.dynamic,
        ranges=opts.frontend.input_ranges,
    )


def _declared_dims(io: IOSpec, opts: BuildOptions) -> tuple[DimRange, ...]:
    """The frontend's default dim ranges (a transformers directory's batch, seq), ``--dynamic``'s by name over them."""
    given = {d.name for d in opts.frontend.dynamic}
    return tuple(d for d in io.dims if d.name not in given) + tuple(opts.frontend.dynamic)


def _copy_source_files(source: SourceModel, stage: Path) -> None:
    """Files the frontend hands on as they are (a tokenizer): hashed into the manifest like every file."""
    for rel, file in sorted(source.files.items()):
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, stage / rel)
