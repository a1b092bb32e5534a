"""The text-generation build, one straight line: load the causal LM -> export prefill + decode over one weight
file -> the passes and the target's graph rewrites -> the build tail (``compiler.build_tail``: compile through the
cache, load, token-exact validation, benchmark, manifest, store).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.store import staging_dir
from aotforge.compiler import read_tracker
from aotforge.compiler.build_direct import DirectPlan
from aotforge.compiler.build_direct import remember as remember_direct
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import TailJob, compile_and_store, key_toolchain, place_artifact, start_worker
from aotforge.compiler.builder import isolation_of
from aotforge.compiler.generative.decoder_work import STAGE_PRELOAD, DecoderWork
from aotforge.compiler.generative.export import decoder_spec, save_shared
from aotforge.compiler.generative.export_cache import export_cache_dir
from aotforge.compiler.generative.graph_passes import backend_target_passes, compile_passes, graph_passes_of
from aotforge.compiler.generative.graph_stage import exported_graphs, pass_graphs
from aotforge.compiler.generative.graphs import refuse_unsupported
from aotforge.compiler.generative.pass_list import decoder_pass_options
from aotforge.compiler.generative.quality import validate_quality
from aotforge.compiler.generative.source import CausalLM, load_causal_lm
from aotforge.compiler.generative.validation import validate_generation
from aotforge.compiler.generative.weight_calibration import calibrated_source, weight_only_params
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import (
    DECODE_FILE,
    PREFILL_FILE,
    TEXT_GENERATION,
    VERIFY_FILE,
    WEIGHTS_FILE,
    DecoderSpec,
)
from aotforge.core.errors import OptionsError, TargetUnavailableError
from aotforge.core.options import options_from_dict
from aotforge.targets import generative_backend, get_target
from aotforge.targets.base import DecoderInputs, GenerativeBackend, Target

Progress = Callable[[str], None]


def build_generative(model: Any, opts: BuildOptions, say: Progress, direct: DirectPlan | None = None) -> BuildResult:
    """Compile a causal LM for ``opts.target`` as a generative artifact (``load(path).generate``)."""
    target = get_target(opts.target)
    if opts.prepare_only or generative_backend(opts.target).bundle_plan is not None:
        # Device targets: prepared as a bundle, finished on the device host (bundled.py).
        from aotforge.compiler.generative.bundled import build_bundled

        return build_bundled(model, opts, say)
    started = time.perf_counter()
    opts = decoder_pass_options(opts)
    backend = _backend(opts, target)
    target_opts = _target_options(opts, target, backend)

    def export(stage: Path) -> tuple[CausalLM, TailJob]:
        return _export(model, opts, say, target, target_opts, backend, stage)

    return export_and_store(opts, target, direct, started, say, export)


def export_and_store(
    opts: BuildOptions,
    target: Target,
    direct: DirectPlan | None,
    started: float,
    say: Progress,
    export: Callable[[Path], tuple[CausalLM, TailJob]],
) -> BuildResult:
    """Every text-generation build around its ``export`` (of the graphs into the stage, and the tail's job for
    them): the compile's worker started first, the export recorded for the direct cache, the one tail, and the
    direct cache's entry before the artifact is stored."""
    direct = direct or DirectPlan(None, "not planned")
    with contextlib.ExitStack() as resources:
        # The compile's worker starts now: its imports overlap loading and exporting the model.
        worker = start_worker(target, isolation_of(opts), (*STAGE_PRELOAD, target.generative_module))
        if worker is not None:
            resources.enter_context(worker)
        stage = resources.enter_context(staging_dir(opts.out))
        # Everything before the compile is what the direct mode skips: record the files it reads.
        with read_tracker.recording(enabled=direct.key is not None) as reads:
            source, job = export(stage)
        job = dataclasses.replace(job, worker=worker)

        def remember(manifest: Manifest, cache: dict[str, Any]) -> None:
            if direct.key is not None:
                remember_direct(direct, reads, cache["key"], manifest, source.name, opts, stage)
                cache["direct"] = direct.reason

        manifest = compile_and_store(job, stage, started, say, before_store=remember)
    return BuildResult(job.place.path_of(manifest), manifest)


def _export(
    model: Any,
    opts: BuildOptions,
    say: Progress,
    target: Target,
    target_opts: Any,
    backend: GenerativeBackend,
    stage: Path,
) -> tuple[CausalLM, TailJob]:
    """The causal LM's graphs into ``stage`` (exported, through the passes and the target's rewrites), and the
    tail's job for them."""
    say("loading the causal LM")
    source = load_causal_lm(model, opts.name)
    spec = decoder_spec(source.model, opts.generation.max_seq_len, opts.generation.max_batch)
    refuse_unsupported(source.model.config, source.name, opts.target, spec.max_seq_len)
    if backend.plan is not None:  # options the target cannot honour are refused before the export
        backend.plan(spec, target_opts)
    if opts.generation.speculative_k and not backend.speculative:
        raise OptionsError(f"--speculative-k: {opts.target} text-generation artifacts have no verify graph yet")
    # Calibrated int4 changes the weights exported (the source stays the fp32 reference) and may set per-layer bits.
    weight_only = weight_only_params(backend_target_passes(opts, target, backend)[1])
    exported, opts, pass_entries = calibrated_source(source, opts, weight_only, say)
    graph_passes, backend_passes = graph_passes_of(opts, target, backend), compile_passes(opts, target, backend)
    place = place_artifact(opts.out, opts.name or source.name, opts.version, opts.target, plots=opts.benchmark.plots)
    attention, plain_why = _decode_attention(backend, exported, spec)
    verify_width = opts.generation.speculative_k + 1 if opts.generation.speculative_k else 0
    export_dir = export_cache_dir(opts.export_cache_dir, opts.cache_dir)
    # A speculative build's prefill and verify also return the LM head's input, what a feature draft reads.
    k = opts.generation.speculative_k
    graphs = exported_graphs(export_dir, exported, spec, place.name, attention, k, say, hidden=bool(k))
    prefill = graphs[PREFILL_FILE]
    entries, rewrites = pass_graphs(graphs, spec, backend, graph_passes, say, dump_ir=opts.passes.dump_ir)
    pass_entries += entries
    if opts.passes.dump_ir is not None:
        _dump_compiled(graphs, opts.passes.dump_ir, say)
    # The passes are deterministic, so equal weights stay equal and save_shared still stores them once.
    weights = save_shared(graphs, stage)
    for rel, file in sorted(source.files.items()):
        shutil.copyfile(file, stage / rel)
    info = {
        "decode_attention": attention,
        **({"decode_attention_plain_because": plain_why} if plain_why else {}),
        **({"fusions": rewrites} if rewrites else {}),
        **(
            {"speculative": {"max_tokens": opts.generation.speculative_k, "verify_width": verify_width}}
            if verify_width
            else {}
        ),
    }
    # A build that changes numerics is gated on quality (held-out perplexity), an fp32 one on exact tokens.
    quantized = any(e.get("changes_numerics") for e in pass_entries) or bool(backend_passes)
    work = DecoderWork(
        backend=backend,
        spec=spec,
        ir_files=(*graphs, WEIGHTS_FILE),
        kept=tuple(sorted(source.files)),
        inputs=DecoderInputs(verify_width=verify_width, passes=backend_passes),
        info=info,
        ir={"sha256": _graphs_sha(stage), "opset": prefill.opset_imports.get("", 0)},
        validate=_validator(source, spec, opts, quantized),
        bench=opts.benchmark.bench,
        stored_weights=lambda staged: _stored_weights(staged, weights, backend.weights_file),
    )
    toolchain = key_toolchain(opts.target, target.probe())
    job = TailJob(
        place=place,
        target=target,
        target_options=target_opts,
        work=work,
        source={"format": source.format, "sha256": source.sha256, "task": TEXT_GENERATION, **source.details},
        passes=pass_entries,
        toolchain=toolchain,
        cache_dir=opts.cache_dir,
        build_extra={"toolchain_key": toolchain},
        isolation=isolation_of(opts),
    )
    return source, job


def _validator(
    source: CausalLM, spec: DecoderSpec, opts: BuildOptions, quantized: bool
) -> Callable[[Any, str, Progress], dict[str, Any]]:
    """Greedy tokens against transformers; where the passes change numerics, quality gates the build instead."""

    def validate(runner: Any, name: str, say: Progress) -> dict[str, Any]:
        say("validating greedy generation against transformers")
        validation = validate_generation(
            source.model,
            runner,
            spec,
            seed=opts.validation.seed,
            tolerance=opts.validation.tolerance,
            min_agreement=opts.generation.min_token_agreement,
            name=name,
            gate=not quantized,
        )
        if quantized:
            say("validating quality: held-out perplexity and KL against the fp32 model")
            validation = _quality_validation(source, runner, spec, opts, name, validation)
        return validation

    return validate


def _dump_compiled(graphs: Mapping[str, Any], dump_dir: Path, say: Progress) -> None:
    """``--dump-ir``: each graph as the target compiles it (after the passes and the target's rewrites)."""
    import onnx_ir as ir

    for file_name, graph in graphs.items():
        graph_name = file_name.removesuffix(".onnx")
        path = dump_dir / graph_name / "compiled.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        say(f"writing the {graph_name} graph to {path}")
        ir.save(graph, path, external_data="compiled.onnx.data")


def _decode_attention(backend: GenerativeBackend, model: Any, spec: Any) -> tuple[str, str]:
    """The decode attention the export writes, and why it is the plain (masked) one where the backend's fused
    attention cannot run this model ('' otherwise)."""
    refusal = backend.decode_attention_refusal
    why = refusal(model, spec) if refusal is not None and backend.decode_attention != "masked" else ""
    return ("masked", why) if why else (backend.decode_attention, "")


def _quality_validation(
    source: CausalLM, runner: Any, spec: Any, opts: BuildOptions, name: str, tokens: dict[str, Any]
) -> dict[str, Any]:
    """The validation record of a build whose passes change numerics: quality gated, greedy tokens reported."""
    quality = validate_quality(
        source.model,
        runner,
        spec,
        text_file=opts.generation.eval_text,
        tokenizer_dir=source.tokenizer_dir,
        max_increase=opts.generation.max_perplexity_increase,
        name=name,
    )
    return {
        **tokens,
        "reference": "the fp32 source model (torch) on held-out text; greedy tokens vs transformers reported",
        "metric": "perplexity increase over fp32 and mean KL(fp32 || artifact) per token (quality)",
        "quality": quality,
        "passed": True,
    }


def _backend(opts: BuildOptions, target: Target) -> GenerativeBackend:
    """The target's generative backend; a target without one is refused before any work."""
    probe = target.probe()
    if not probe.compiles:
        raise TargetUnavailableError(f"target {opts.target} is not available on this host: {probe.reason}")
    return generative_backend(opts.target)


def _stored_weights(stage: Path, exported: Mapping[str, int], file: str) -> dict[str, Any]:
    """``target.info.weights``: the file the runner reads the weights from and its bytes, and how much sharing
    saved in the export. A target that stores the weights in a file of its own (tvm) replaced ``weights.data``,
    whose bytes are kept as ``exported_bytes``: the manifest names no file the artifact lacks."""
    stored = {**exported, "file": file, "weights_file_bytes": (stage / file).stat().st_size}
    if file != WEIGHTS_FILE:
        stored["exported_bytes"] = exported["weights_file_bytes"]
    return stored


def _target_options(opts: BuildOptions, target: Any, backend: GenerativeBackend) -> Any:
    """The target's options with the backend's ``target_defaults`` under the user's (onnxruntime: a decode step's
    thread hand-offs want a short spin, ``targets.onnxruntime.decoder.TARGET_DEFAULTS``)."""
    layered = {**backend.target_defaults, **opts.target_options}
    return options_from_dict(target.options_type, layered, what=opts.target)


def _graphs_sha(stage: Path) -> str:
    """One digest over both graphs (their weights are in ``files`` like every file)."""
    digest = hashlib.sha256()
    for name in (PREFILL_FILE, DECODE_FILE, VERIFY_FILE):
        if name == VERIFY_FILE and not (stage / name).is_file():
            continue
        digest.update(sha256_file(stage / name).encode())
    return digest.hexdigest()
