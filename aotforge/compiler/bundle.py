"""Remote builds: ``compile --prepare-only`` writes a build bundle, ``finish`` completes it on the device host.

A bundle is a directory holding everything the target compile needs and nothing that must be
trusted blindly: the IR after passes, the options, the input spec, the target's build plan (e.g.
TensorRT's optimization profiles), the validation inputs with the source model's outputs on them
(so the device host validates against the source without having it), a manifest draft, a format
version and the sha256 of every file. ``finish`` re-checks all of that before any compile work.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.store import staging_dir
from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.build_plan import PlannedBuild
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import compile_and_store, key_toolchain, pending_manifest, place_artifact
from aotforge.compiler.bundle_format import (
    BUNDLE_FORMAT,
    VALIDATION_NPZ,
    bundle_path,
    finish_job,
    json_values,
    read_bundle,
    seal_bundle,
)
from aotforge.compiler.encoder_work import EncoderWork
from aotforge.compiler.isolation import Isolation
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.compiler.validation import validation_plan
from aotforge.core.decoder import TEXT_GENERATION
from aotforge.core.errors import ArtifactError, OptionsError, TargetUnavailableError, UnknownReferenceError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import IOSpec
from aotforge.core.target_record import TargetRecord
from aotforge.passes import contrib_op_passes
from aotforge.targets import get_target
from aotforge.targets.base import Arrays, BuildContext, Target


@dataclasses.dataclass(frozen=True)
class BundleDraft:
    """What ``build`` hands over when it stops before the target compile."""

    model: ir.Model
    io: IOSpec
    name: str
    version: int | None
    target: str
    target_options: Any
    passes: tuple[str, ...]
    source: Mapping[str, Any]
    pass_entries: Sequence[Mapping[str, Any]]
    validation: Mapping[str, Any]
    bench: Mapping[str, Any] | None
    samples: Sequence[Arrays]
    reference: Callable[[Arrays], Arrays]
    #: Files the frontend hands on as they are (a transformers directory's tokenizer, by artifact-relative path):
    #: they travel in the bundle, so the finished artifact carries them as a direct build's does.
    files: Mapping[str, Path] = dataclasses.field(default_factory=dict)


def write_bundle(draft: BundleDraft, out: Path, toolchain: Mapping[str, str]) -> Path:
    """Write the bundle atomically (staged beside its final place, then renamed) and return its path."""
    target = get_target(draft.target)
    if target.compiles_torch_program:  # neuron: a bundle carries the ONNX IR only
        raise OptionsError(
            f"--prepare-only for {draft.target}: neuronx-cc compiles from the torch program, which a bundle cannot "
            "carry without pickling it; run the build on the Inf2/Trn host instead"
        )
    final = bundle_path(out, draft.name, draft.target)
    if final.exists():
        raise UnknownReferenceError(f"{final} already exists: remove it or give another --name")
    with staging_dir(out) as stage:
        ir.save(draft.model, stage / "model.onnx")
        for rel, file in sorted(draft.files.items()):
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, stage / rel)
        arrays, index = _validation_arrays(draft.samples, draft.reference)
        np.savez(stage / VALIDATION_NPZ, **arrays)  # type: ignore[arg-type]
        ctx = BuildContext(
            io=draft.io,
            passes=draft.passes,
            source_format=str(draft.source["format"]),
            contrib_passes=contrib_op_passes(draft.passes),
        )
        body = {
            "format_version": BUNDLE_FORMAT,
            "target": draft.target,
            "target_options": json_values(dataclasses.asdict(draft.target_options)),
            "plan": target.bundle_plan(draft.model, draft.target_options, ctx),
            "io": draft.io.to_dict(),
            "passes": list(draft.passes),
            "validation_index": index,
            "manifest_draft": {
                "name": draft.name,
                "version": draft.version,
                "source": dict(draft.source),
                "passes": [dict(p) for p in draft.pass_entries],
                "validation": dict(draft.validation),
                "toolchain_prepared": dict(toolchain),
                "ir_opset": draft.model.opset_imports.get("", 0),
            },
            "bench": dict(draft.bench) if draft.bench is not None else None,
        }
        seal_bundle(stage, body, final)
    return final


def prepare_bundle(planned: PlannedBuild, opts: BuildOptions, name: str) -> BuildResult:
    """Write a build bundle for ``aotforge finish`` instead of compiling here; the result holds its draft."""
    source = planned.source
    validation = validation_plan(
        source.format, opts.validation.tolerance, planned.samples, opts.validation.seed, planned.sizes, planned.inputs
    )
    draft = BundleDraft(
        model=source.ir,
        io=planned.ctx.io,
        name=name,
        version=opts.version,
        target=opts.target,
        target_options=planned.target_options,
        passes=planned.ctx.passes,
        source={"format": source.format, "sha256": source.sha256, **source.details},
        pass_entries=planned.pass_entries,
        validation=validation,
        bench=dataclasses.asdict(opts.benchmark.runs) if opts.benchmark.bench else None,
        samples=planned.samples,
        reference=source.reference,
        files=source.files,
    )
    path = write_bundle(draft, opts.out, toolchain_versions())
    manifest = pending_manifest(
        path,
        name,
        opts.version,
        TargetRecord(opts.target, dataclasses.asdict(planned.target_options)),
        source=draft.source,
        ir={"sha256": sha256_file(path / "model.onnx"), "opset": source.ir.opset_imports.get("", 0)},
        passes=draft.pass_entries,
        io=planned.ctx.io.to_dict(),
        validation=validation,
    )
    return BuildResult(path, manifest)


def finish(
    path: Path,
    out: Path,
    *,
    target_name: str | None = None,
    bench: bool | None = None,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    worker: Mapping[str, Any] | None = None,
    isolation: Isolation | None = None,
) -> BuildResult:
    """Compile, validate, benchmark and store a bundle's artifact through the same tail as ``build``.

    ``worker`` (a farm's executor, host, node) is recorded in the manifest's ``build`` section.
    """
    started = time.perf_counter()
    data = read_bundle(path)
    if data.get("task") == TEXT_GENERATION:
        raise OptionsError(
            f"{path} is a text-generation bundle: finish it with `aotforge finish` "
            "(aotforge.compiler.generative.finish.finish_bundle)"
        )
    name = target_name or data["target"]
    target = get_target(name)
    probe = target.probe()
    if not probe.available:
        raise TargetUnavailableError(f"cannot finish {path} for {name} on this host: {probe.reason}")
    # Options of the prepared target do not apply to another one (e.g. finishing on onnxruntime).
    opts_data = data["target_options"] if name == data["target"] else {}
    target_opts = options_from_dict(target.options_type, opts_data, what=name)
    draft = data["manifest_draft"]
    io = IOSpec.from_dict(data["io"])
    model = ir.load(path / "model.onnx")
    passes = tuple(data["passes"])
    ctx = BuildContext(
        io=io, passes=passes, source_format=draft["source"]["format"], contrib_passes=contrib_op_passes(passes)
    )
    target.plan(model, target_opts, ctx)
    _check_plan(target, model, target_opts, ctx, data)
    samples, references = _load_validation(path, data["validation_index"])
    lookup = {id(s): r for s, r in zip(samples, references, strict=True)}
    place = place_artifact(out, draft["name"], draft["version"], name)
    with staging_dir(out) as stage:
        for rel in data["files"]:
            if rel != VALIDATION_NPZ:  # the IR, its external data and the source's files, byte for byte
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path / rel, stage / rel)
        work = EncoderWork(
            model=model,
            ctx=ctx,
            samples=samples,
            reference=lambda x: lookup[id(x)],
            validation={
                **draft["validation"],
                "reference": f"{draft['validation']['reference']} (outputs stored in the bundle)",
            },
            bench=_bench_options(data["bench"], bench),
            batch=int(draft["validation"]["bound_dims"].get("batch", 1)),
        )
        toolchain = key_toolchain(name, probe)
        job = finish_job(
            path, data, place, target, target_opts, work, toolchain,
            cache_dir=cache_dir, worker=worker, isolation=isolation,
        )  # fmt: skip
        manifest = compile_and_store(job, stage, started, progress or (lambda _msg: None))
    return BuildResult(place.path_of(manifest), manifest)


def _check_plan(target: Target, model: ir.Model, opts: Any, ctx: BuildContext, data: Mapping[str, Any]) -> None:
    # The plan is recomputed from the same inputs; a difference means this aotforge plans otherwise.
    if data["target"] == target.name and target.bundle_plan(model, opts, ctx) != data["plan"]:
        raise ArtifactError(
            f"the {target.name} build plan in the bundle differs from what this aotforge plans for it: "
            "prepare the bundle with the same aotforge version as the device host"
        )


def _validation_arrays(samples: Sequence[Arrays], reference: Callable[[Arrays], Arrays]) -> tuple[dict, list]:
    arrays: dict[str, np.ndarray] = {}
    index = []
    for i, sample in enumerate(samples):
        outputs = reference(sample)
        entry: dict[str, dict[str, str]] = {"inputs": {}, "outputs": {}}
        for kind, values in (("inputs", sample), ("outputs", outputs)):
            for j, (tensor, value) in enumerate(values.items()):
                key = f"s{i}_{kind}_{j}"  # npz keys are file names: never the tensor's own name
                arrays[key] = np.asarray(value)
                entry[kind][tensor] = key
        index.append(entry)
    return arrays, index


def _load_validation(path: Path, index: Sequence[Mapping[str, Any]]) -> tuple[list[Arrays], list[Arrays]]:
    with np.load(path / VALIDATION_NPZ, allow_pickle=False) as data:
        samples = [{t: data[k] for t, k in e["inputs"].items()} for e in index]
        refs = [{t: data[k] for t, k in e["outputs"].items()} for e in index]
    return samples, refs


def _bench_options(prepared: Mapping[str, Any] | None, override: bool | None) -> BenchOptions | None:
    """The bundle's benchmark settings, unless ``finish --no-bench`` (or ``--bench`` adds the default)."""
    if override is False or (override is None and prepared is None):
        return None
    return BenchOptions(**prepared) if prepared else BenchOptions()
