"""Text generation for the device targets (tensorrt, neuron): ``--prepare-only`` bundles and ``finish``.

A text-generation bundle holds what the device host compiles (tensorrt: the prefill and decode ONNX graphs
over one ``weights.data``; neuron: the causal LM as safetensors, whose prefill / decode torch modules the
host traces per bucket: neuronx-cc has no ONNX frontend), the target's plan (TensorRT's optimization
profiles per engine / Neuron's context-encoding and token-generation buckets), the validation prompts with
the source model's greedy tokens and per-step logits on them (the device host validates token for token
without the source), the decoder's cache geometry, and the hash of every file (``compiler.bundle``'s format,
with ``task: text-generation``). Preparing also runs what the bundle holds on this host's CPU
(``cpu_check``): the ONNX graphs under onnxruntime, or the torch modules padded to their buckets exactly
as the Neuron runtime pads them, token for token against the source.

A direct build for these targets is the same two halves in one process on the device host: it refuses
first, with the target probe's reason, where the SDK or device is missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.card_plots import manifest_plots
from aotforge.artifacts.hashing import hash_tree, sha256_file
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.names import check_name
from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import build_record, key_toolchain, place_artifact, store_artifact
from aotforge.compiler.bundle_format import (
    BUNDLE_FORMAT,
    BUNDLE_JSON,
    VALIDATION_NPZ,
    _digest,
    _dump,
    _jsonable,
    bundle_path,
    read_bundle,
)
from aotforge.compiler.generative.benchmark import benchmark_generation
from aotforge.compiler.generative.export import decoder_spec, export_graphs, save_shared
from aotforge.compiler.generative.source import load_causal_lm
from aotforge.compiler.generative.validation import check_generation, reference_greedy, validation_prompts
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, TEXT_GENERATION, DecoderSpec, prefill_io
from aotforge.core.errors import ArtifactError, OptionsError, TargetUnavailableError, UnknownReferenceError
from aotforge.core.options import options_from_dict
from aotforge.core.target_record import TargetRecord
from aotforge.passes import DEFAULT_PRESET
from aotforge.targets import get_target
from aotforge.targets.generative import generative_backend

Progress = Callable[[str], None]
#: Where a bundle for a target that compiles torch (neuron) keeps the causal LM (config + safetensors).
MODEL_DIR = "model"


def build_bundled(model: Any, opts: BuildOptions, say: Progress) -> BuildResult:
    """``--prepare-only``: write the bundle. Otherwise refuse without the device, else prepare and finish here."""
    backend = generative_backend(opts.target)
    if not hasattr(backend, "bundle_plan_generative"):
        raise OptionsError(
            "--prepare-only bundles of text-generation builds are for tensorrt and neuron: build for "
            f"{opts.target} on the host itself"
        )
    if opts.speculative_k:
        raise OptionsError(f"--speculative-k: {opts.target} text-generation artifacts have no verify graph yet")
    if opts.prepare_only:
        return prepare_generative(model, opts, say, cpu_check=True)
    probe = get_target(opts.target).probe()
    if not probe.available:  # before any work: the build must run and validate on this host
        raise TargetUnavailableError(f"target {opts.target} is not available on this host: {probe.reason}")
    opts.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aotforge-bundle-", dir=opts.out) as tmp:
        prepared = prepare_generative(model, dataclasses.replace(opts, out=Path(tmp)), say, cpu_check=False)
        data = read_bundle(prepared.path)
        return finish_generative(prepared.path, data, opts.out, bench=opts.bench, progress=say, plots=opts.plots)


def prepare_generative(model: Any, opts: BuildOptions, say: Progress, *, cpu_check: bool) -> BuildResult:
    """Write the text-generation bundle for ``opts.target`` (see the module docstring); the result holds its draft."""
    target = get_target(opts.target)
    backend = generative_backend(opts.target)
    target_opts = options_from_dict(target.options_type, opts.target_options, what=opts.target)
    say("loading the causal LM")
    source = load_causal_lm(model, opts.name)
    spec = decoder_spec(source.model, opts.max_seq_len, opts.max_batch)
    plan = backend.bundle_plan_generative(spec, target_opts)  # refuses options the target cannot honour first
    graphs_from = backend.GRAPHS_FROM
    if tuple(opts.passes) not in ((DEFAULT_PRESET,), ()):
        # The one text-generation pass, weight-only, emits ONNX Runtime contrib ops (MatMulNBits).
        raise OptionsError(
            f"text-generation builds for {opts.target} take no passes (weight-only emits ONNX Runtime's MatMulNBits, "
            f"which {opts.target} cannot run): drop --passes"
        )
    name = opts.name or source.name
    check_name(name, "--name")
    final = bundle_path(opts.out, name, opts.target)
    if final.exists():
        raise UnknownReferenceError(f"{final} already exists: remove it or give another --name")
    attention = getattr(backend, "DECODE_ATTENTION", "masked")
    with staging_dir(opts.out) as stage:
        if graphs_from == "onnx":
            say("exporting the prefill and decode graphs")
            prefill, decode = export_graphs(source.model, spec, name, decode_attention=attention)
            weights = save_shared({PREFILL_FILE: prefill, DECODE_FILE: decode}, stage)
            opset = prefill.opset_imports.get("", 0)
        else:
            say("saving the causal LM's weights (safetensors) for the device host to trace")
            source.model.save_pretrained(stage / MODEL_DIR, safe_serialization=True)
            size = sum(f.stat().st_size for f in (stage / MODEL_DIR).glob("*.safetensors"))
            weights = {"weights_file_bytes": size, "unshared_bytes": size}
            opset = 0
        for rel, file in sorted(source.files.items()):
            shutil.copyfile(file, stage / rel)
        say("greedy reference tokens from the source model")
        prompts, new = validation_prompts(spec, opts.seed)
        references = [reference_greedy(source.model, p, new) for p in prompts]
        arrays: dict[str, np.ndarray] = {}
        for i, (prompt, (tokens, logits)) in enumerate(zip(prompts, references, strict=True)):
            arrays[f"prompt_{i}"], arrays[f"tokens_{i}"] = prompt, np.asarray(tokens, dtype=np.int64)
            arrays[f"logits_{i}"] = np.stack(logits).astype(np.float32)
        np.savez(stage / VALIDATION_NPZ, **arrays)  # type: ignore[arg-type]
        validation = {
            "seed": opts.seed,
            "tolerance": opts.tolerance,
            "min_token_agreement": opts.min_token_agreement,
            "prompts": len(prompts),
            "new_tokens": new,
        }
        check = None
        if cpu_check:
            say("running the bundle's graphs on this host's CPU against the source")
            check = _cpu_check(stage, graphs_from, spec, source.model, plan, prompts, references, opts, name)
        body = {
            "format_version": BUNDLE_FORMAT,
            "task": TEXT_GENERATION,
            "target": opts.target,
            "target_options": _jsonable(dataclasses.asdict(target_opts)),
            "plan": _jsonable(plan),
            "decoder": spec.to_dict(),
            "graphs_from": graphs_from,
            "decode_attention": attention,
            "weights": weights,
            "passes": list(opts.passes),
            "validation": validation,
            "cpu_check": check,
            "manifest_draft": {
                "name": name,
                "version": opts.version,
                "source": {"format": source.format, "sha256": source.sha256, "task": TEXT_GENERATION},
                "passes": [],
                "toolchain_prepared": toolchain_versions(),
                "ir_opset": opset,
            },
            "bench": opts.bench,
            "prepared": {"host": socket.gethostname(), "machine": platform.machine()},
            "files": hash_tree(stage),
        }
        (stage / BUNDLE_JSON).write_text(_dump({**body, "bundle_sha256": _digest(body)}))
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stage, final)
    manifest = Manifest(
        name=name,
        version=opts.version or 0,
        target=TargetRecord(opts.target, dataclasses.asdict(target_opts), {"task": TEXT_GENERATION, "plan": plan}),
        toolchain=toolchain_versions(),
        source=dict(body["manifest_draft"]["source"]),  # type: ignore[index]
        ir={"sha256": _inputs_sha(final, graphs_from), "opset": opset},
        passes=[],
        io={},
        validation={**validation, "cpu_check": check, "passed": False, "pending": "aotforge finish"},
        benchmark=None,
        files={},
        build={"bundle": str(final)},
    )
    return BuildResult(final, manifest)


def _cpu_check(
    stage: Path,
    graphs_from: str,
    spec: DecoderSpec,
    model: Any,
    plan: Mapping[str, Any],
    prompts: list[np.ndarray],
    references: list[tuple[list[int], list[np.ndarray]]],
    opts: BuildOptions,
    name: str,
) -> dict[str, Any]:
    """The bundle's graphs on this CPU, through ``generate``, token for token against the source (raises if not)."""
    if graphs_from == "onnx":
        from aotforge.targets.generative.ort_engine import OrtStepEngine
        from aotforge.targets.onnxruntime import OrtOptions, session_options

        engine: Any = OrtStepEngine(stage, spec, session_options(OrtOptions()), ["CPUExecutionProvider"])
        runtime = "onnxruntime CPU over the bundle's prefill.onnx / decode.onnx"
    else:
        engine = torch_bucket_engine(model, spec, plan)
        runtime = "the prefill / decode torch modules on CPU, padded to the planned buckets"
    from aotforge.targets.generative.runner import GenerativeRunner

    record = check_generation(
        prompts,
        references,
        GenerativeRunner(engine),
        spec,
        seed=opts.seed,
        tolerance=opts.tolerance,
        min_agreement=opts.min_token_agreement,
        name=name,
    )
    out = {k: record[k] for k in ("token_agreement", "max_logits_rel_l2", "new_tokens", "passed")}
    if hasattr(engine, "calls"):
        out["graphs_run"] = sorted({"{}.b{}-{}".format(*k) for k in engine.calls})
    return {"runtime": runtime, **out}


def torch_bucket_engine(model: Any, spec: DecoderSpec, plan: Mapping[str, Any]) -> Any:
    """Neuron's bucket routing and padding over the torch modules the device host traces, run on CPU."""
    import torch

    from aotforge.compiler.generative.graphs import Decode, Prefill
    from aotforge.targets.neuron.generative import CONTEXT_ENCODING, BucketStepEngine

    modules = {"prefill": Prefill(model).eval(), "decode": Decode(model).eval()}

    def run(key: tuple[str, int, int], arrays: list[np.ndarray]) -> list[np.ndarray]:
        module = modules["prefill" if key[0] == CONTEXT_ENCODING else "decode"]
        with torch.inference_mode():
            out = module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
        return [t.numpy() for t in out]

    keys = {(g["kind"], int(g["batch"]), int(g["length"])): None for g in plan["graphs"]}
    return BucketStepEngine(spec, keys, run)


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
    if name == data["target"] and _jsonable(backend.bundle_plan_generative(spec, target_opts)) != data["plan"]:
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
        extra: dict[str, Any] = {}
        if graphs_from == "torch":
            from aotforge.compiler.generative.graphs import Decode, Prefill

            model = load_causal_lm(stage / MODEL_DIR).model
            extra["modules"] = {"prefill": Prefill(model).eval(), "decode": Decode(model).eval()}
        say(f"compiling for {name}")
        compiled = backend.compile_generative(stage, spec, target_opts, say, **extra)
        if graphs_from == "torch":
            shutil.rmtree(stage / MODEL_DIR)  # the compiled graphs hold the weights; the source stays in the bundle
        info = {
            **compiled.target_info,
            "task": TEXT_GENERATION,
            "decoder": spec.to_dict(),
            "decode_attention": data["decode_attention"],
            "weights": data["weights"],
        }
        record = TargetRecord(target.name, dataclasses.asdict(target_opts), info)
        runner = backend.load_generative(stage, record)
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
            ir={"sha256": _inputs_sha(path, graphs_from), "opset": int(draft["ir_opset"])},
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


def _inputs_sha(bundle: Path, graphs_from: str) -> str:
    """One digest over what the target compiles: the two graphs (their weights are in ``files``), or the weights."""
    digest = hashlib.sha256()
    files = (
        [PREFILL_FILE, DECODE_FILE]
        if graphs_from == "onnx"
        else sorted(str(p.relative_to(bundle)) for p in (bundle / MODEL_DIR).iterdir() if p.is_file())
    )
    for rel in files:
        digest.update(sha256_file(bundle / rel).encode())
    return digest.hexdigest()


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
