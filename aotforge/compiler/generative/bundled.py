"""Text generation for the device targets (tensorrt, neuron): ``--prepare-only`` bundles and direct builds.

A text-generation bundle holds what the device host compiles (tensorrt: the prefill and decode ONNX graphs
over one ``weights.data``; neuron: the causal LM as safetensors, whose prefill / decode torch modules the
host traces per bucket: neuronx-cc has no ONNX frontend), the target's plan (TensorRT's optimization
profiles per engine / Neuron's context-encoding and token-generation buckets), the validation prompts with
the source model's greedy tokens and per-step logits on them (the device host validates token for token
without the source), the decoder's cache geometry, and the hash of every file (``compiler.bundle``'s format,
with ``task: text-generation``). Preparing also runs what the bundle holds on this host's CPU
(``cpu_check``): the ONNX graphs under onnxruntime, or the torch modules padded to their buckets exactly
as the Neuron runtime pads them, token for token against the source.

What each target's bundle carries is ``compiler.generative.bundle_inputs``; ``finish`` is
``compiler.generative.bundle_finish``. A direct build for these targets is the same two halves in one process on
the device host: it refuses first, with the target probe's reason, where the SDK or device is missing.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.names import check_name
from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import pending_manifest
from aotforge.compiler.bundle_format import (
    bundle_path,
    read_bundle,
    seal_bundle,
)
from aotforge.compiler.generative.bundle_finish import finish_generative
from aotforge.compiler.generative.bundle_inputs import BundleInputs, bundle_inputs, inputs_sha
from aotforge.compiler.generative.export import decoder_spec
from aotforge.compiler.generative.generative_bundle import body_head, refuse_existing_bundle, write_references
from aotforge.compiler.generative.graphs import refuse_unsupported
from aotforge.compiler.generative.source import load_causal_lm
from aotforge.compiler.generative.validation import check_generation
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec
from aotforge.core.errors import OptionsError, TargetUnavailableError
from aotforge.core.options import options_from_dict
from aotforge.core.target_record import TargetRecord
from aotforge.passes import DEFAULT_PRESET
from aotforge.targets import get_target
from aotforge.targets.generative import generative_backend

Progress = Callable[[str], None]


def build_bundled(model: Any, opts: BuildOptions, say: Progress) -> BuildResult:
    """``--prepare-only``: write the bundle. Otherwise refuse without the device, else prepare and finish here."""
    _bundle_plan(opts.target)
    if opts.generation.speculative_k:
        raise OptionsError(f"--speculative-k: {opts.target} text-generation artifacts have no verify graph yet")
    if opts.prepare_only:
        return prepare_generative(model, opts, say, cpu_check=True)
    probe = get_target(opts.target).probe()
    if not probe.available:  # before any work: the build must run and validate on this host
        raise TargetUnavailableError(f"target {opts.target} is not available on this host: {probe.reason}")
    # The bundle half lives in a staging directory of --out: removed when done or failed, swept after a kill.
    with staging_dir(opts.out) as tmp:
        prepared = prepare_generative(model, dataclasses.replace(opts, out=tmp), say, cpu_check=False)
        data = read_bundle(prepared.path)
        return finish_generative(
            prepared.path,
            data,
            opts.out,
            bench=opts.benchmark.bench,
            progress=say,
            plots=opts.benchmark.plots,
            cache_dir=opts.cache_dir,
            isolation=opts.isolation.limits(),
        )


def _bundle_plan(target: str) -> Callable[[DecoderSpec, Any], dict[str, Any]]:
    """The plan a bundle for ``target`` carries; a target without bundles (built on its host itself) is refused."""
    plan = generative_backend(target).bundle_plan
    if plan is None:
        raise OptionsError(
            f"--prepare-only bundles of text-generation builds are for tensorrt and neuron: build for {target} "
            "on the host itself"
        )
    return plan


def prepare_generative(model: Any, opts: BuildOptions, say: Progress, *, cpu_check: bool) -> BuildResult:
    """Write the text-generation bundle for ``opts.target`` (see the module docstring); the result holds its draft."""
    target = get_target(opts.target)
    backend = generative_backend(opts.target)
    target_opts = options_from_dict(target.options_type, opts.target_options, what=opts.target)
    say("loading the causal LM")
    source = load_causal_lm(model, opts.name)
    spec = decoder_spec(source.model, opts.generation.max_seq_len, opts.generation.max_batch)
    # The device host traces or compiles these same graphs, so what they cannot compute is refused here too.
    refuse_unsupported(source.model.config, source.name, opts.target, spec.max_seq_len)
    plan = _bundle_plan(opts.target)(spec, target_opts)  # refuses options the target cannot honour first
    graphs_from = backend.graphs_from
    inputs = bundle_inputs(graphs_from)
    if tuple(opts.passes.names) not in ((DEFAULT_PRESET,), ()):
        # The one text-generation pass, weight-only, emits ONNX Runtime contrib ops (MatMulNBits).
        raise OptionsError(
            f"text-generation builds for {opts.target} take no passes (weight-only emits ONNX Runtime's MatMulNBits, "
            f"which {opts.target} cannot run): drop --passes"
        )
    name = opts.name or source.name
    check_name(name, "--name")
    final = bundle_path(opts.out, name, opts.target)
    refuse_existing_bundle(final)
    attention = backend.decode_attention
    with staging_dir(opts.out) as stage:
        say(inputs.writing)
        weights, opset = inputs.write(stage, source.model, spec, name, attention)
        for rel, file in sorted(source.files.items()):
            shutil.copyfile(file, stage / rel)
        prompts, references, validation = write_references(stage, source.model, spec, opts, say)
        check = None
        if cpu_check:
            say("running the bundle's graphs on this host's CPU against the source")
            check = _cpu_check(stage, inputs, spec, source.model, plan, prompts, references, opts, name)
        body = {
            **body_head(opts, target_opts, plan, spec, graphs_from),
            "decode_attention": attention,
            "weights": weights,
            "passes": list(opts.passes.names),
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
            "bench": opts.benchmark.bench,
        }
        body = seal_bundle(stage, body, final)
    manifest = pending_manifest(
        final,
        name,
        opts.version,
        TargetRecord(opts.target, dataclasses.asdict(target_opts), {"task": TEXT_GENERATION, "plan": plan}),
        source=body["manifest_draft"]["source"],  # type: ignore[index]
        ir={"sha256": inputs_sha(final, graphs_from), "opset": opset},
        passes=[],
        io={},
        validation={**validation, "cpu_check": check},
    )
    return BuildResult(final, manifest)


def _cpu_check(
    stage: Path,
    inputs: BundleInputs,
    spec: DecoderSpec,
    model: Any,
    plan: Mapping[str, Any],
    prompts: list[np.ndarray],
    references: list[tuple[list[int], list[np.ndarray]]],
    opts: BuildOptions,
    name: str,
) -> dict[str, Any]:
    """The bundle's graphs on this CPU, through ``generate``, token for token against the source (raises if not)."""
    engine, runtime = inputs.cpu_engine(stage, spec, model, plan)
    from aotforge.targets.generative.runner import GenerativeRunner

    record = check_generation(
        prompts,
        references,
        GenerativeRunner(engine),
        spec,
        seed=opts.validation.seed,
        tolerance=opts.validation.tolerance,
        min_agreement=opts.generation.min_token_agreement,
        name=name,
    )
    out = {k: record[k] for k in ("token_agreement", "max_logits_rel_l2", "new_tokens", "passed")}
    if hasattr(engine, "calls"):
        out["graphs_run"] = sorted({"{}.b{}-{}".format(*k) for k in engine.calls})
    return {"runtime": runtime, **out}
