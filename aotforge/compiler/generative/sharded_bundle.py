"""Sharded ``--prepare-only`` bundles for a device target (tensorrt at ``--tensor-parallel N``) and their ``finish``.

Prepare, on any host: the sharded build's export of each shard (``ranks/<r>/``: its graphs over its weights), the
source model's greedy tokens and logits on the validation prompts, the shards run on this CPU as onnxruntime ranks
token for token against them (``cpu_check``), and ``bundle.json``: the target's plan of each shard's engines, which
``finish`` re-plans and compares, and the split's record. The format is the unsharded bundle's
(``compiler.generative.bundled``) with a ``shards`` section.

Finish, on the device host: the sharded build's tail (``ShardWork``) over the bundle's files: each shard compiled by
the target's shard runtime (``ShardRuntime.compile``) in the isolated worker through the build cache, the shards
loaded as one model (a process each), validated against the references the bundle carries, stored.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import key_toolchain, pending_manifest, place_artifact
from aotforge.compiler.bundle_format import (
    VALIDATION_NPZ,
    bundle_path,
    finish_job,
    json_values,
    seal_bundle,
)
from aotforge.compiler.generative import pp_build, tp_build
from aotforge.compiler.generative.generative_bundle import (
    body_head,
    finishing_target,
    reference_validator,
    refuse_existing_bundle,
    refuse_replanned,
    store_finished,
    write_references,
)
from aotforge.compiler.generative.pass_list import decoder_pass_options
from aotforge.compiler.generative.shard_work import ShardWork
from aotforge.compiler.generative.sharded_build import Sharding, export_shards, refuse_sharded, sharded_target_options
from aotforge.compiler.generative.validation import check_generation
from aotforge.compiler.isolation import Isolation
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec
from aotforge.core.errors import OptionsError
from aotforge.core.options import options_from_dict
from aotforge.core.target_record import TargetRecord
from aotforge.targets import generative_backend, get_target, shard_runtime

Progress = Callable[[str], None]


def prepare_sharded(model: Any, opts: BuildOptions, say: Progress, sharding: Sharding) -> BuildResult:
    """Write the sharded bundle of ``model`` for ``opts.target`` (see the module docstring)."""
    target = get_target(opts.target)
    backend = generative_backend(opts.target)
    opts = decoder_pass_options(opts)
    refuse_sharded(opts, sharding)  # a target without bundles among what it refuses
    plan_of = backend.bundle_plan
    runtime = shard_runtime(opts.target, sharding.kind)
    assert plan_of is not None and runtime is not None, "refuse_sharded refused a target without them"
    target_opts = sharded_target_options(opts, target, backend, runtime)
    if opts.name:  # before the exports where the name is known (else the model's, checked once it is loaded)
        refuse_existing_bundle(bundle_path(opts.out, opts.name, opts.target))
    with staging_dir(opts.out) as stage:
        source, job = export_shards(model, opts, say, sharding, target, target_opts, backend, stage)
        work = job.work
        assert isinstance(work, ShardWork)
        name = job.place.name
        final = bundle_path(opts.out, name, opts.target)
        refuse_existing_bundle(final)
        prompts, references, validation = write_references(stage, source.model, work.spec, opts, say)
        say(f"running the bundle's {sharding.noun} graphs on this host's CPU against the source")
        check = _cpu_check(stage, work, prompts, references, validation, name)
        plan = {"shards": [plan_of(spec, target_opts) for spec in work.specs]}
        body = {
            **body_head(opts, target_opts, plan, work.spec, backend.graphs_from),
            "decode_attention": work.info["decode_attention"],
            "weights": work.info["weights"],
            "passes": list(opts.passes.names),
            "validation": validation,
            "cpu_check": check,
            "shards": {
                "kind": work.kind,
                "folders": list(work.shards),
                "specs": [spec.to_dict() for spec in work.specs],
                "ir_files": list(work.ir_files),
                "kept": list(work.kept),
                "info": json_values(dict(work.info)),
                "weight_bytes": work.weight_bytes,
            },
            "manifest_draft": {
                "name": name,
                "version": opts.version,
                "source": job.source,
                "passes": json_values(job.passes),
                "toolchain_prepared": toolchain_versions(),
                "ir": dict(work.ir),
                "ir_opset": int(work.ir["opset"]),
            },
            "bench": opts.benchmark.bench,
        }
        seal_bundle(stage, body, final)
    manifest = pending_manifest(
        final,
        name,
        opts.version,
        TargetRecord(opts.target, dataclasses.asdict(target_opts), {"task": TEXT_GENERATION, "plan": plan}),
        source=job.source,
        ir=dict(work.ir),
        passes=job.passes,
        io={},
        validation={**validation, "cpu_check": check},
    )
    return BuildResult(final, manifest)


def _cpu_check(
    stage: Path,
    work: ShardWork,
    prompts: list[np.ndarray],
    references: list[tuple[list[int], list[np.ndarray]]],
    validation: Mapping[str, Any],
    name: str,
) -> dict[str, Any]:
    """The shards as onnxruntime ranks on this CPU, through ``generate``, token for token against the source (raises
    if not). Their session settings are written for the check and removed after it: the bundle holds the graphs."""
    from aotforge.targets.generative.runner import GenerativeRunner
    from aotforge.targets.onnxruntime import OrtOptions
    from aotforge.targets.onnxruntime.decoder import SESSION_FILE, compile_shard

    if work.kind != "tensor_parallel":
        raise OptionsError(f"{work.noun} bundles are not checked on the CPU yet: only tensor-parallel ranks")
    options = OrtOptions(intra_op_threads=1)
    for folder, spec in zip(work.shards, work.specs, strict=True):
        compile_shard(stage / folder, options, spec, len(work.shards))
    try:
        record = TargetRecord("onnxruntime", dataclasses.asdict(options), dict(work.info))
        engine = work.engine(stage, record)
        try:
            checked = check_generation(
                prompts,
                references,
                GenerativeRunner(engine),
                work.spec,
                seed=int(validation["seed"]),
                tolerance=float(validation["tolerance"]),
                min_agreement=float(validation["min_token_agreement"]),
                name=name,
            )
        finally:
            engine.close()
    finally:
        for folder in work.shards:
            (stage / folder / SESSION_FILE).unlink(missing_ok=True)
    out = {k: checked[k] for k in ("token_agreement", "max_logits_rel_l2", "new_tokens", "passed")}
    return {"runtime": f"onnxruntime CPU, {len(work.shards)} {work.noun} processes over the bundle's graphs", **out}


def finish_sharded(
    path: Path,
    data: Mapping[str, Any],
    out: Path,
    *,
    target_name: str | None = None,
    bench: bool | None = None,
    progress: Progress | None = None,
    worker: Mapping[str, Any] | None = None,
    plots: bool = True,
    cache_dir: Path | None = None,
    isolation: Isolation | None = None,
) -> BuildResult:
    """``aotforge finish`` of a checked sharded bundle (``compiler.bundle_format.read_bundle``) for ``target_name``
    (its own target, or one that runs its ONNX shards as they are): each shard compiled by that target's shard
    runtime, validated against the bundle's references, stored."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    name, target, probe = finishing_target(path, data, target_name)
    shards = data["shards"]
    kind = str(shards["kind"])
    sharding = {s.kind: s for s in (tp_build.TENSOR_PARALLEL, pp_build.PIPELINE_PARALLEL)}[kind]
    runtime = shard_runtime(name, kind)
    if runtime is None:
        noun = sharding.noun
        raise OptionsError(f"a {noun} bundle finishes for a target that runs {noun}s; {name} has no {noun}s")
    options = data["target_options"] if name == data["target"] else dict(runtime.target_defaults)
    target_opts = options_from_dict(target.options_type, options, what=name)
    specs = tuple(DecoderSpec.from_dict(s) for s in shards["specs"])
    plan_of = generative_backend(name).bundle_plan
    if plan_of is not None:
        refuse_replanned(name, data, {"shards": [plan_of(spec, target_opts) for spec in specs]})
    spec = DecoderSpec.from_dict(data["decoder"])
    draft = data["manifest_draft"]
    info = {**shards["info"], "options": dataclasses.asdict(target_opts)}
    work = ShardWork(
        kind=kind,
        noun=sharding.noun,
        spec=spec,
        shards=tuple(shards["folders"]),
        specs=specs,
        ir_files=tuple(shards["ir_files"]),
        kept=tuple(shards["kept"]),
        info=info,
        ir=draft["ir"],
        weight_bytes=int(shards["weight_bytes"]),
        validate=reference_validator(path, data, spec),
        bench=bool(data["bench"] if bench is None else bench),
        engine=sharding.engine,
    )
    toolchain = key_toolchain(name, probe)
    place = place_artifact(out, draft["name"], draft["version"], name, plots=plots)
    job = finish_job(
        path, data, place, target, target_opts, work, toolchain,
        cache_dir=cache_dir, worker=worker, isolation=isolation, build_extra={"toolchain_key": toolchain},
    )  # fmt: skip
    staged = tuple(rel for rel in data["files"] if rel != VALIDATION_NPZ)
    return store_finished(path, staged, out, job, started, say)
