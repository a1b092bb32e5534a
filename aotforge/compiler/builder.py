"""``build()``: source model -> IR -> passes -> target -> validated, benchmarked artifact.

One straight line of named steps; each says why it sits where it does.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import platform
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.store import artifact_path, finalize, next_version, staging_dir
from aotforge.compiler import read_tracker
from aotforge.compiler.benchmark import benchmark
from aotforge.compiler.build_direct import BuildResult, DirectPlan
from aotforge.compiler.build_direct import plan as direct_plan
from aotforge.compiler.build_direct import remember as remember_direct
from aotforge.compiler.build_direct import serve as serve_direct
from aotforge.compiler.compile_cache import compile_cached
from aotforge.compiler.frontend_onnx import load_onnx
from aotforge.compiler.frontend_torch import load_torch_file, load_torch_module
from aotforge.compiler.numerics import OutputMetrics, compare_many
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.recipe import int8_shortcuts, load_recipe
from aotforge.compiler.sample_inputs import make_inputs
from aotforge.compiler.source import SourceModel
from aotforge.core.errors import InputSpecError, OptionsError, TargetUnavailableError, ValidationFailedError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import IOSpec, check_dims_used
from aotforge.passes import contrib_op_passes, expand, make_pass
from aotforge.passes.manager import PassRecord, run_passes
from aotforge.targets import get_target
from aotforge.targets.base import BuildContext

Progress = Callable[[str], None]


__all__ = ["BuildResult", "build", "build_resolved", "toolchain_versions"]


def build(
    model: Any,
    options: BuildOptions | None = None,
    *,
    example_inputs: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    recipe: Path | str | None = None,
    **overrides: Any,
) -> BuildResult:
    """Compile ``model`` (a ``.onnx`` / ``.py`` path, a module name, or an ``nn.Module`` with
    ``example_inputs``) for ``options.target`` and write one artifact directory.

    Keyword ``overrides`` are :class:`BuildOptions` fields: ``build(m, target="onnxruntime")``.
    A ``recipe`` TOML (``compiler.recipe``) gives defaults that ``options`` fields differing from
    the defaults, and ``overrides``, replace.
    """
    given = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)} if options else {}
    if recipe is not None:
        defaults = BuildOptions()
        given = {k: v for k, v in given.items() if v != getattr(defaults, k)}
        given = {**load_recipe(recipe), **given}
    opts = BuildOptions.from_dict({**given, **overrides})
    say = progress or (lambda _msg: None)
    direct = direct_plan(model, opts) if example_inputs is None else DirectPlan(None, "an nn.Module, not a file")
    if direct.key is not None:
        served = serve_direct(direct, opts, say)
        if served is not None:
            return served
    return build_resolved(model, opts, example_inputs=example_inputs, progress=say, direct=direct)


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

    # Everything up to the IR after passes is what direct mode skips: record the files it reads.
    with read_tracker.recording(enabled=direct.key is not None) as reads:
        # Target first: an unavailable target or a bad option should cost the user nothing.
        target = get_target(opts.target)
        probe = target.probe()
        # A --prepare-only build stops before the compile, so the host need not have the target.
        if not probe.compiles and not opts.prepare_only:
            raise TargetUnavailableError(f"target {opts.target} is not available on this host: {probe.reason}")
        target_opts = options_from_dict(target.options_type, opts.target_options, what=opts.target)
        pass_names = expand(list(opts.passes))
        stray = sorted(set(opts.pass_params) - set(pass_names))
        if stray:
            raise OptionsError(
                f"parameters given for pass(es) {', '.join(stray)} that are not in --passes {','.join(pass_names)}"
            )
        pass_params = int8_shortcuts(opts, pass_names)
        # A target may need other pass defaults (TensorRT: signed symmetric Q/DQ); the user's win.
        for pass_name, defaults in getattr(target, "pass_defaults", {}).items():
            if pass_name in pass_names:
                pass_params[pass_name] = {**defaults, **pass_params.get(pass_name, {})}
        graph_passes = [make_pass(n, pass_params.get(n)) for n in pass_names]

        say("loading model")
        source = _load(model, opts, example_inputs)
        io = dataclasses.replace(source.io, dims=opts.dynamic)
        check_dims_used(opts.dynamic, io)
        ctx = BuildContext(
            io=io,
            passes=pass_names,
            source_format=source.format,
            torch_program=source.torch_program,
            contrib_passes=contrib_op_passes(pass_names),
        )
        target.plan(source.ir, target_opts, ctx)

        # Validation inputs are drawn before the passes so every build of a model sees the same ones.
        sizes = io.bound_sizes("opt")
        samples = make_inputs(io, sizes, seed=opts.seed, count=opts.validation_samples)
        say(f"running passes: {', '.join(pass_names) or 'none'}")
        records = run_passes(source.ir, graph_passes, opts.dump_ir)

    name = opts.name or source.name
    if opts.prepare_only:
        return _prepare_bundle(source, io, opts, target_opts, pass_names, records, samples, sizes, name)
    version = opts.version or next_version(opts.out, name)
    final = artifact_path(opts.out, name, version, opts.target)
    if final.exists():
        raise InputSpecError(f"{final} already exists: give another --version or leave it out to get the next one")
    with staging_dir(opts.out) as stage:
        ir.save(source.ir, stage / "model.onnx")
        # The target's compiler version is only in CompileResult.toolchain after compiling; its
        # probe details (version, host CPU ...) stand in for it in the cache key.
        key_toolchain = {**toolchain_versions(), **{f"{opts.target}.{k}": str(v) for k, v in probe.details.items()}}
        compiled, cache_record = compile_cached(
            target, source.ir, target_opts, ctx, stage, opts, key_toolchain, [_pass_entry(r) for r in records], say
        )
        target_record = {
            "name": opts.target,
            "options": dataclasses.asdict(target_opts),
            "info": dict(compiled.target_info),
        }
        runner = target.load(stage, {"target": target_record, "io": io.to_dict()})
        say("validating against the source model")
        metrics = compare_many(source.reference, runner.run, samples)
        validation = _validation(source, metrics, opts, sizes)
        if not validation["passed"]:
            raise ValidationFailedError(_validation_message(name, opts.target, metrics, opts.tolerance))
        bench = None
        if opts.bench:
            say("benchmarking")
            batch = sizes.get("batch", 1)
            bench = dataclasses.asdict(benchmark(runner.run, samples[0], opts.bench_options, batch=batch))
        manifest = Manifest(
            name=name,
            version=version,
            target=target_record,
            toolchain={**toolchain_versions(), **compiled.toolchain},
            source={"format": source.format, "sha256": source.sha256},
            ir={"sha256": sha256_file(stage / "model.onnx"), "opset": source.ir.opset_imports.get("", 0)},
            passes=[_pass_entry(r) for r in records],
            io=io.to_dict(),
            validation=validation,
            benchmark=bench,
            files={},
            build={
                "seconds": round(time.perf_counter() - started, 2),
                "pass_seconds": {f"{i + 1}:{r.name}": r.seconds for i, r in enumerate(records)},
                "host": socket.gethostname(),
                "machine": platform.machine(),
                "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                **({"cache": cache_record} if cache_record is not None else {}),
            },
        )
        if cache_record is not None and direct.key is not None:
            remember_direct(direct, reads, cache_record["key"], manifest, source.name, opts)
            cache_record["direct"] = direct.reason
        manifest = finalize(stage, manifest, final)
    return BuildResult(final, manifest)


def _prepare_bundle(
    source: SourceModel,
    io: IOSpec,
    opts: BuildOptions,
    target_opts: Any,
    pass_names: tuple[str, ...],
    records: list[PassRecord],
    samples: list[Any],
    sizes: Mapping[str, int],
    name: str,
) -> BuildResult:
    """Write a build bundle for ``aotforge finish`` (compiler.bundle) instead of compiling here."""
    from aotforge.compiler.bundle import BundleDraft, write_bundle

    validation = {k: v for k, v in _validation(source, {}, opts, sizes).items() if k not in ("metrics", "passed")}
    draft = BundleDraft(
        model=source.ir,
        io=io,
        name=name,
        version=opts.version,
        target=opts.target,
        target_options=target_opts,
        passes=tuple(pass_names),
        source={"format": source.format, "sha256": source.sha256},
        pass_entries=[_pass_entry(r) for r in records],
        validation=validation,
        bench=dataclasses.asdict(opts.bench_options) if opts.bench else None,
        samples=samples,
        reference=source.reference,
    )
    path = write_bundle(draft, opts.out, toolchain_versions())
    manifest = Manifest(
        name=name,
        version=opts.version or 0,
        target={"name": opts.target, "options": dataclasses.asdict(target_opts), "info": {}},
        toolchain=toolchain_versions(),
        source=dict(draft.source),
        ir={"sha256": sha256_file(path / "model.onnx"), "opset": source.ir.opset_imports.get("", 0)},
        passes=[dict(p) for p in draft.pass_entries],
        io=io.to_dict(),
        validation={**validation, "passed": False, "pending": "aotforge finish"},
        benchmark=None,
        files={},
        build={"bundle": str(path)},
    )
    return BuildResult(path, manifest)


def _pass_entry(record: PassRecord) -> dict[str, Any]:
    # Durations differ between identical builds, so they live in the manifest's build section.
    entry = dataclasses.asdict(record)
    entry.pop("seconds")
    return entry


def _load(model: Any, opts: BuildOptions, example_inputs: Mapping[str, Any] | None) -> SourceModel:
    if isinstance(model, (str, Path)):
        text = str(model)
        if text.endswith(".onnx"):
            return load_onnx(Path(text), opts.input_ranges)
        return load_torch_file(text, opts.dynamic, opts.input_ranges)
    if example_inputs is None:
        raise InputSpecError("build() of an nn.Module needs example_inputs={name: tensor, ...}")
    return load_torch_module(
        model,
        example_inputs,
        name=opts.name or type(model).__name__.lower(),
        dims=opts.dynamic,
        ranges=opts.input_ranges,
    )


def _validation(
    source: SourceModel, metrics: Mapping[str, OutputMetrics], opts: BuildOptions, sizes: Mapping[str, int]
) -> dict[str, Any]:
    return {
        "reference": "torch eager" if source.format == "torch" else "onnxruntime on the unmodified ONNX",
        "metric": "rel_l2",
        "tolerance": opts.tolerance,
        "samples": opts.validation_samples,
        "seed": opts.seed,
        "bound_dims": dict(sizes),
        "metrics": {n: dataclasses.asdict(m) for n, m in metrics.items()},
        "passed": all(m.rel_l2 <= opts.tolerance for m in metrics.values()),
    }


def _validation_message(name: str, target: str, metrics: Mapping[str, OutputMetrics], tolerance: float) -> str:
    bad = [
        f"{n}: rel L2 {m.rel_l2:.3g}, max abs {m.max_abs:.3g}, cosine {m.cosine:.6f}"
        for n, m in metrics.items()
        if not m.rel_l2 <= tolerance
    ]
    return (
        f"{name} on {target} does not match the source model ({'; '.join(bad)}; tolerance rel L2 {tolerance:g}): "
        "drop the pass that changes numerics, or raise --tolerance if this error is acceptable"
    )


def toolchain_versions() -> dict[str, str]:
    versions = {"onnx": onnx.__version__, "onnx-ir": ir.__version__, "python": platform.python_version()}
    for dist in ("aotforge", "onnxscript", "torch"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions
