"""``aotforge finish`` for text-generation bundles: compile on the device host, validate, benchmark, store.

The bundle (``compiler.generative.bundled``) is read and checked first (``compiler.bundle_format.read_bundle``);
the target re-plans from the bundle's options and must arrive at the plan it carries; the artifact is
validated token for token against the source's greedy tokens and logits stored in the bundle (the device host
never needs the source model) and written through a staging directory, as every build is.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.card_plots import manifest_plots
from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import build_record, key_toolchain, place_artifact, store_artifact
from aotforge.compiler.bundle_format import BUNDLE_JSON, VALIDATION_NPZ, json_values, read_bundle
from aotforge.compiler.generative.benchmark import benchmark_generation
from aotforge.compiler.generative.bundle_inputs import bundle_inputs, inputs_sha
from aotforge.compiler.generative.validation import check_generation
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec, prefill_io
from aotforge.core.errors import ArtifactError, OptionsError, TargetUnavailableError
from aotforge.core.options import options_from_dict
from aotforge.core.target_record import TargetRecord
from aotforge.targets import get_target
from aotforge.targets.generative import generative_backend

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
) -> BuildResult:
    """Compile a checked text-generation bundle (``compiler.bundle.read_bundle``), validate it token for token
    against the references it carries, benchmark, and store the artifact."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    name = target_name or data["target"]
    graphs_from = data["graphs_from"]
    if name != data["target"] and not (name == "onnxruntime" and graphs_from == "onnx"):
        raise OptionsError(
            f"a {data['target']} text-generation bundle finishes for {data['target']}"
            f"{' or onnxruntime (its ONNX graphs)' if graphs_from == 'onnx' else ''}, not {name}"
        )
    target = get_target(name)
    probe = target.probe()
    if not probe.available:
        raise TargetUnavailableError(f"cannot finish {path} for {name} on this host: {probe.reason}")
    backend = generative_backend(name)
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
    prompts, references = _load_references(path, int(data["validation"]["prompts"]))
    draft = data["manifest_draft"]
    place = place_artifact(out, draft["name"], draft["version"], name, plots=plots)
    with staging_dir(out) as stage:
        for rel in data["files"]:
            if rel != VALIDATION_NPZ:
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path / rel, stage / rel)
        inputs = bundle_inputs(graphs_from)
        say(f"compiling for {name}")
        compiled = backend.compile(stage, spec, target_opts, say, **inputs.compile_kwargs(stage))
        inputs.after_compile(stage)
        info = {
            **compiled.target_info,
            "task": TEXT_GENERATION,
            "decoder": spec.to_dict(),
            "decode_attention": data["decode_attention"],
            "weights": data["weights"],
        }
        record = TargetRecord(target.name, dataclasses.asdict(target_opts), info)
        runner = backend.load(stage, record)
        say("validating greedy generation against the references in the bundle")
        checked = data["validation"]
        validation = check_generation(
            prompts,
            references,
            runner,
            spec,
            seed=int(checked["seed"]),
            tolerance=float(checked["tolerance"]),
            min_agreement=float(checked["min_token_agreement"]),
            name=place.name,
        )
        validation["reference"] += " (tokens and logits stored in the bundle)"
        run_bench = data["bench"] if bench is None else bench
        bench_record = None
        if run_bench:
            say("benchmarking generation")
            bench_record = {
                "generation": benchmark_generation(runner, spec, int(data["weights"]["weights_file_bytes"]))
            }
        manifest = Manifest(
            name=place.name,
            version=place.version,
            target=record,
            toolchain={**toolchain_versions(), **compiled.toolchain},
            source=dict(draft["source"]),
            ir={"sha256": inputs_sha(path, graphs_from), "opset": int(draft["ir_opset"])},
            passes=list(draft["passes"]),
            io=prefill_io(spec).to_dict(),
            validation=validation,
            benchmark=bench_record,
            files={},
            build=build_record(
                started,
                toolchain_key=key_toolchain(name, probe),
                bundle={"sha256": sha256_file(path / BUNDLE_JSON), "prepared": data["prepared"]},
                **({"worker": dict(worker)} if worker else {}),
            ),
        )
        if place.plots:
            manifest_plots(stage, manifest.validation, manifest.benchmark, manifest.passes)
        manifest = store_artifact(stage, manifest, place)
    return BuildResult(place.path_of(manifest), manifest)


def _load_references(path: Path, count: int) -> tuple[list[np.ndarray], list[tuple[list[int], list[np.ndarray]]]]:
    with np.load(path / VALIDATION_NPZ, allow_pickle=False) as data:
        prompts = [data[f"prompt_{i}"] for i in range(count)]
        refs = [([int(t) for t in data[f"tokens_{i}"]], list(data[f"logits_{i}"])) for i in range(count)]
    return prompts, refs


def finish_bundle(
    path: Path,
    out: Path,
    *,
    target_name: str | None = None,
    bench: bool | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> BuildResult:
    """``aotforge finish``: a text-generation bundle here, any other through ``compiler.bundle.finish``."""
    data = read_bundle(path)
    if data.get("task") == TEXT_GENERATION:
        return finish_generative(path, data, out, target_name=target_name, bench=bench, progress=progress)
    from aotforge.compiler.bundle import finish

    return finish(path, out, target_name=target_name, bench=bench, cache_dir=cache_dir, progress=progress)
