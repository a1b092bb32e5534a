"""``aotforge finish`` for text-generation bundles: compile on the device host, validate, benchmark, store.

The bundle (``compiler.generative.bundled``) is read and checked first (``compiler.bundle_format.read_bundle``);
the target re-plans from the bundle's options and must arrive at the plan it carries; the artifact is
validated token for token against the source's greedy tokens and logits stored in the bundle (the device host
never needs the source model) and written through a staging directory, as every build is.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import TailJob, compile_and_store, key_toolchain, place_artifact
from aotforge.compiler.bundle_format import VALIDATION_NPZ, finish_job, json_values, read_bundle
from aotforge.compiler.generative.bundle_inputs import bundle_inputs, inputs_sha
from aotforge.compiler.generative.decoder_work import DecoderWork
from aotforge.compiler.generative.validation import check_generation
from aotforge.compiler.isolation import Isolation
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec
from aotforge.core.errors import ArtifactError, OptionsError, TargetUnavailableError
from aotforge.core.options import options_from_dict
from aotforge.targets import generative_backend, generative_targets, get_target, shard_runtime
from aotforge.targets.base import DecoderInputs

Progress = Callable[[str], None]


def finish_generative(
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
    """Compile a checked text-generation bundle (``compiler.bundle.read_bundle``), validate it token for token
    against the references it carries, benchmark, and store the artifact."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    name = target_name or data["target"]
    graphs_from = data["graphs_from"]
    target = get_target(name)
    # A bundle of ONNX graphs may be finished by a target that runs them as they are (onnxruntime); a bundle of
    # torch weights is traced by the target it was planned for only.
    backend = generative_backend(name)
    if name != data["target"] and not (graphs_from == "onnx" and backend.finishes_onnx_bundles):
        others = " or ".join(n for n in generative_targets() if generative_backend(n).finishes_onnx_bundles)
        also = f" or {others} (its ONNX graphs)" if graphs_from == "onnx" else ""
        raise OptionsError(f"a {data['target']} text-generation bundle finishes for {data['target']}{also}, not {name}")
    probe = target.probe()
    if not probe.available:
        raise TargetUnavailableError(f"cannot finish {path} for {name} on this host: {probe.reason}")
    if "shards" in data:  # a sharded bundle: each shard compiled by the target's shard runtime
        from aotforge.compiler.generative.sharded_bundle import finish_sharded

        runtime = shard_runtime(name, str(data["shards"]["kind"]))
        defaults = runtime.target_defaults if runtime is not None else {}
        options = data["target_options"] if name == data["target"] else dict(defaults)
        return finish_sharded(
            path,
            data,
            out,
            target,
            options_from_dict(target.options_type, options, what=name),
            bench=bench,
            say=say,
            plots=plots,
            cache_dir=cache_dir,
            isolation=isolation,
            worker=worker,
        )
    target_opts = options_from_dict(
        target.options_type, data["target_options"] if name == data["target"] else {}, what=name
    )
    spec = DecoderSpec.from_dict(data["decoder"])
    bundle_plan = backend.bundle_plan
    if (
        name == data["target"]
        and bundle_plan is not None
        and json_values(bundle_plan(spec, target_opts)) != data["plan"]
    ):
        raise ArtifactError(
            f"the {name} plan in the bundle differs from what this aotforge plans for it: prepare the bundle "
            "with the same aotforge version as the device host"
        )
    draft = data["manifest_draft"]
    place = place_artifact(out, draft["name"], draft["version"], name, plots=plots)
    inputs = bundle_inputs(graphs_from)
    staged = tuple(rel for rel in data["files"] if rel != VALIDATION_NPZ)
    compiled_from = tuple(inputs.compiled_files(path))
    work = DecoderWork(
        backend=backend,
        spec=spec,
        ir_files=compiled_from,
        kept=tuple(rel for rel in staged if rel not in compiled_from),
        inputs=DecoderInputs(),
        info={"decode_attention": data["decode_attention"]},
        ir={"sha256": inputs_sha(path, graphs_from), "opset": int(draft["ir_opset"])},
        validate=reference_validator(path, data, spec),
        bench=bool(data["bench"] if bench is None else bench),
        stored_weights=lambda _stage: data["weights"],
        # A torch bundle's modules are made from the stage and cannot cross to a worker: traced here.
        modules=inputs.modules if graphs_from == "torch" else None,
        after_compile=inputs.after_compile if graphs_from == "torch" else None,
    )
    toolchain = key_toolchain(name, probe)
    job = finish_job(
        path, data, place, target, target_opts, work, toolchain,
        cache_dir=cache_dir, worker=worker, isolation=isolation, build_extra={"toolchain_key": toolchain},
    )  # fmt: skip
    return store_finished(path, staged, out, job, started, say)


def store_finished(
    path: Path, staged: tuple[str, ...], out: Path, job: TailJob, started: float, say: Progress
) -> BuildResult:
    """The bundle's ``staged`` files copied into a staging directory of ``out``, and the tail run over them: compile,
    validate, benchmark, store."""
    with staging_dir(out) as stage:
        for rel in staged:
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path / rel, stage / rel)
        manifest = compile_and_store(job, stage, started, say)
    return BuildResult(job.place.path_of(manifest), manifest)


def reference_validator(
    path: Path, data: Mapping[str, Any], spec: DecoderSpec
) -> Callable[[Any, str, Progress], dict[str, Any]]:
    """``(runner, artifact name, say) -> the validation record``: greedy generation against the references the
    bundle at ``path`` carries (tokens and per-step logits), gated as its ``validation`` record says."""
    checked = data["validation"]
    count = int(checked["prompts"])
    with np.load(path / VALIDATION_NPZ, allow_pickle=False) as arrays:
        prompts = [arrays[f"prompt_{i}"] for i in range(count)]
        references = [([int(t) for t in arrays[f"tokens_{i}"]], list(arrays[f"logits_{i}"])) for i in range(count)]

    def validate(runner: Any, artifact: str, say: Progress) -> dict[str, Any]:
        say("validating greedy generation against the references in the bundle")
        validation = check_generation(
            prompts,
            references,
            runner,
            spec,
            seed=int(checked["seed"]),
            tolerance=float(checked["tolerance"]),
            min_agreement=float(checked["min_token_agreement"]),
            name=artifact,
        )
        validation["reference"] += " (tokens and logits stored in the bundle)"
        return validation

    return validate


def finish_bundle(
    path: Path,
    out: Path,
    *,
    target_name: str | None = None,
    bench: bool | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    isolation: Isolation | None = None,
) -> BuildResult:
    """``aotforge finish``: a text-generation bundle here, any other through ``compiler.bundle.finish``.
    ``isolation``: where the compile and the validation runs happen (default: a spawned worker, as ``build``'s)."""
    data = read_bundle(path)
    if data.get("task") == TEXT_GENERATION:
        if isolation is not None and isolation.run_deadline_s != Isolation.run_deadline_s:
            raise OptionsError(
                "--run-deadline does not apply to a text-generation bundle (its greedy tokens are validated in this "
                "process, against the references the bundle carries): drop it"
            )
        return finish_generative(
            path,
            data,
            out,
            target_name=target_name,
            bench=bench,
            progress=progress,
            cache_dir=cache_dir,
            isolation=isolation,
        )
    from aotforge.compiler.bundle import finish

    return finish(
        path, out, target_name=target_name, bench=bench, cache_dir=cache_dir, progress=progress, isolation=isolation
    )
