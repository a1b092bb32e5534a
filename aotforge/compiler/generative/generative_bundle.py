"""What the text-generation bundles share, unsharded (``bundled``, ``bundle_finish``) and sharded
(``sharded_bundle``): the head of their ``bundle.json``, the source's greedy references written into the bundle and
the check of an artifact against them, the target that may finish a bundle, and the finish's store."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import TailJob, compile_and_store
from aotforge.compiler.bundle_format import BUNDLE_FORMAT, VALIDATION_NPZ, json_values
from aotforge.compiler.generative.validation import check_generation, reference_greedy, validation_prompts
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec
from aotforge.core.errors import ArtifactError, OptionsError, TargetUnavailableError, UnknownReferenceError
from aotforge.targets import generative_backend, generative_targets, get_target
from aotforge.targets.base import Target

Progress = Callable[[str], None]


def body_head(
    opts: BuildOptions, target_opts: Any, plan: Mapping[str, Any], spec: DecoderSpec, graphs_from: str
) -> dict[str, Any]:
    """What every text-generation ``bundle.json`` starts with: its format, the target and its options, the target's
    plan, the decoder's cache geometry and what the target compiles from ("onnx" or "torch")."""
    return {
        "format_version": BUNDLE_FORMAT,
        "task": TEXT_GENERATION,
        "target": opts.target,
        "target_options": json_values(dataclasses.asdict(target_opts)),
        "plan": json_values(plan),
        "decoder": spec.to_dict(),
        "graphs_from": graphs_from,
    }


def write_references(
    stage: Path, model: Any, spec: DecoderSpec, opts: BuildOptions, say: Progress
) -> tuple[list[np.ndarray], list[tuple[list[int], list[np.ndarray]]], dict[str, Any]]:
    """The source's greedy tokens and per-step logits on the validation prompts, written to ``VALIDATION_NPZ`` in
    ``stage`` (the device host validates against them without the source); the prompts, the references and the
    bundle's ``validation`` record."""
    say("greedy reference tokens from the source model")
    prompts, new = validation_prompts(spec, opts.validation.seed)
    references = [reference_greedy(model, p, new) for p in prompts]
    arrays: dict[str, np.ndarray] = {}
    for i, (prompt, (tokens, logits)) in enumerate(zip(prompts, references, strict=True)):
        arrays[f"prompt_{i}"], arrays[f"tokens_{i}"] = prompt, np.asarray(tokens, dtype=np.int64)
        arrays[f"logits_{i}"] = np.stack(logits).astype(np.float32)
    np.savez(stage / VALIDATION_NPZ, **arrays)  # type: ignore[arg-type]
    validation = {
        "seed": opts.validation.seed,
        "tolerance": opts.validation.tolerance,
        "min_token_agreement": opts.generation.min_token_agreement,
        "prompts": len(prompts),
        "new_tokens": new,
    }
    return prompts, references, validation


def refuse_existing_bundle(bundle: Path) -> None:
    """A bundle is never written over: one already at ``bundle`` is refused."""
    if bundle.exists():
        raise UnknownReferenceError(f"{bundle} already exists: remove it or give another --name")


def refuse_replanned(name: str, data: Mapping[str, Any], planned: Any) -> None:
    """The plan this aotforge makes for the bundle's own target (``planned``, JSON-ready) must be the plan the bundle
    carries: a different one means another aotforge version prepared it."""
    if name == data["target"] and json_values(planned) != data["plan"]:
        raise ArtifactError(
            f"the {name} plan in the bundle differs from what this aotforge plans for it: prepare the bundle "
            "with the same aotforge version as the device host"
        )


def finishing_target(path: Path, data: Mapping[str, Any], target_name: str | None) -> tuple[str, Target, Any]:
    """The target that finishes the text-generation bundle at ``path`` (``target_name``, default the one it was
    prepared for), its probe; refused where it cannot: a bundle of ONNX graphs may be finished by a target that runs
    them as they are (onnxruntime), a bundle of torch weights only by the target it was planned for, and only on a
    host where the target runs."""
    name = target_name or data["target"]
    graphs_from = data["graphs_from"]
    target = get_target(name)
    backend = generative_backend(name)
    if name != data["target"] and not (graphs_from == "onnx" and backend.finishes_onnx_bundles):
        others = " or ".join(n for n in generative_targets() if generative_backend(n).finishes_onnx_bundles)
        also = f" or {others} (its ONNX graphs)" if graphs_from == "onnx" else ""
        raise OptionsError(f"a {data['target']} text-generation bundle finishes for {data['target']}{also}, not {name}")
    probe = target.probe()
    if not probe.available:
        raise TargetUnavailableError(f"cannot finish {path} for {name} on this host: {probe.reason}")
    return name, target, probe


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
