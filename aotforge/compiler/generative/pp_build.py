"""The pipeline-parallel text-generation build: the build line of ``build.py`` once per stage, one artifact.

Load the causal LM -> the split into stages (``pipeline_parallel.plan``) -> for each stage: its layers of the
model -> export -> the target's rewrites -> ``stages/<s>/`` with the stage's graphs and weights -> load the
stages as one model (a process each) -> token-exact validation against the unsharded source model ->
benchmark -> manifest -> store: from the stages' session settings on, the one build tail
(``compiler.build_tail.compile_and_store``) with :class:`StageWork`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import (
    Progress,
    TailJob,
    compile_and_store,
    key_toolchain,
    place_artifact,
)
from aotforge.compiler.generative.build import _backend, _decode_attention, _target_options
from aotforge.compiler.generative.export import decoder_spec, export_graphs, export_verify, save_shared
from aotforge.compiler.generative.graphs import unsupported
from aotforge.compiler.generative.pipeline_parallel import StagePlan, plan, stage_model
from aotforge.compiler.generative.source import load_causal_lm
from aotforge.compiler.generative.tp_build import RankWork
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, TEXT_GENERATION, VERIFY_FILE, DecoderSpec
from aotforge.core.errors import OptionsError, UnsupportedModelError
from aotforge.core.target_record import TargetRecord
from aotforge.passes import DEFAULT_PRESET
from aotforge.targets import get_target
from aotforge.targets.generative.stages import StagedEngine

#: Targets with a stage runtime (``targets/generative/stages.py``).
PP_TARGETS = ("onnxruntime",)


def build_pipeline_parallel(model: Any, opts: BuildOptions, say: Progress) -> BuildResult:
    """Compile a causal LM as ``opts.pipeline_parallel`` stage graphs in one artifact (``load(path).generate``)."""
    started = time.perf_counter()
    _refuse(opts)
    target = get_target(opts.target)
    backend = _backend(opts, target)
    # One intra-op thread a stage unless the user sets it: the stages are the parallelism.
    target_opts = _target_options(
        dataclasses.replace(opts, target_options={"intra_op_threads": 1, **opts.target_options}), target, backend
    )
    say("loading the causal LM")
    source = load_causal_lm(model, opts.name)
    spec = decoder_spec(source.model, opts.generation.max_seq_len, opts.generation.max_batch)
    why = unsupported(source.model.config, spec.max_seq_len)
    if why:
        raise UnsupportedModelError(f"{source.name} cannot be built for {opts.target}: {why}")
    stages = plan(source.model, opts.generation.pipeline_parallel, source.name)
    place = place_artifact(opts.out, opts.name or source.name, opts.version, opts.target, plots=False)
    verify_width = opts.generation.speculative_k + 1 if opts.generation.speculative_k else 0
    with staging_dir(opts.out) as stage_root:
        attention, plain_why = _decode_attention(backend, source.model, spec)
        dirs, specs, weights, opset = [], [], {}, 0
        for s in range(stages.degree):
            say(f"exporting stage {s} of {stages.degree} (layers {stages.bounds[s]} .. {stages.bounds[s + 1] - 1})")
            stage_dir = stage_root / "stages" / str(s)
            stage_dir.mkdir(parents=True)
            part = stage_model(source.model, stages, s)
            stage_spec = _stage_spec(spec, stages, s)
            prefill, decode = export_graphs(part, stage_spec, place.name, attention)
            graphs, opset = {PREFILL_FILE: prefill, DECODE_FILE: decode}, prefill.opset_imports.get("", 0)
            if verify_width:
                graphs[VERIFY_FILE] = export_verify(part, stage_spec, place.name, attention)
            for step in (backend.prepare_graphs, backend.rewrite_graphs):
                if step is not None:
                    step(graphs, stage_spec)
            weights[str(s)] = save_shared(graphs, stage_dir)["weights_file_bytes"]
            dirs.append(f"stages/{s}")
            specs.append(stage_spec)
            del part, graphs
        for rel, file in sorted(source.files.items()):
            shutil.copyfile(file, stage_root / rel)
        info = {
            "device": "cpu",
            "options": dataclasses.asdict(target_opts),
            "task": TEXT_GENERATION,
            "decoder": spec.to_dict(),
            "decode_attention": attention,
            **({"decode_attention_plain_because": plain_why} if plain_why else {}),
            "pipeline_parallel": _pp_record(stages, dirs, specs, weights),
            "weights": {"weights_file_bytes": sum(weights.values()), "per_stage_bytes": weights},
            **(
                {"speculative": {"max_tokens": opts.generation.speculative_k, "verify_width": verify_width}}
                if verify_width
                else {}
            ),
        }
        work = StageWork(
            spec=spec,
            ranks=tuple(dirs),
            info=info,
            ir={"sha256": _graphs_sha(stage_root, dirs), "opset": opset},
            weight_bytes=sum(weights.values()),
            model=source.model,
            opts=opts,
        )
        toolchain = key_toolchain(opts.target, target.probe())
        job = TailJob(
            place=place,
            target=target,
            target_options=target_opts,
            work=work,
            source={"format": source.format, "sha256": source.sha256, "task": TEXT_GENERATION},
            passes=[],
            toolchain=toolchain,
            build_extra={"toolchain_key": toolchain},
        )
        manifest = compile_and_store(job, stage_root, started, say)
    return BuildResult(place.path_of(manifest), manifest)


@dataclasses.dataclass(frozen=True)
class StageWork(RankWork):
    """The build tail's work for a pipeline-parallel artifact: a tensor-parallel one's (each stage's session
    settings, token-exact validation against the unsharded source model) with the stages loaded as one model."""

    def start(self, stage: Path, record: TargetRecord) -> Any:
        return StagedEngine(stage, record)


def _stage_spec(spec: DecoderSpec, stages: StagePlan, stage: int) -> DecoderSpec:
    """The stage's cache geometry: its layers only; logits one column wide except on the last stage."""
    vocab = spec.vocab if stage == stages.degree - 1 else 1
    return dataclasses.replace(spec, layers=len(stages.layers(stage)), vocab=vocab)


def _refuse(opts: BuildOptions) -> None:
    """What this first pipeline-parallel line does not do yet, refused before any work."""
    if opts.target not in PP_TARGETS:
        raise OptionsError(
            f"--pipeline-parallel: {opts.target} has no stage runtime yet (only {', '.join(PP_TARGETS)}): "
            "build it with --pipeline-parallel 1"
        )
    if opts.generation.tensor_parallel > 1:
        raise OptionsError(
            "--pipeline-parallel with --tensor-parallel is not built yet: choose one of them (the other at 1)"
        )
    if tuple(opts.passes.names) not in ((DEFAULT_PRESET,), ()):
        raise OptionsError(
            "--pipeline-parallel builds are fp32 for now: drop --precision / --passes, or build with "
            "--pipeline-parallel 1"
        )
    if opts.prepare_only:
        raise OptionsError("--pipeline-parallel builds are not bundled (--prepare-only): build on the serving host")


def _pp_record(stages: StagePlan, dirs: list[str], specs: list[DecoderSpec], weights: dict[str, int]) -> dict[str, Any]:
    """``target.info.pipeline_parallel``: the split, where each stage's files are, and each stage's cache."""
    return {
        "degree": stages.degree,
        "layout": stages.to_dict(),
        "stages": dirs,
        "decoders": [s.to_dict() for s in specs],
        # As many micro-batches as stages: each stage busy once the pipe is full, each step's weights read M times.
        "micro_batches": stages.degree,
        "stage_weights_bytes": weights,
        "stage_kv_cache_bytes_per_slot": [s.kv_cache_bytes(1) for s in specs],
    }


def _graphs_sha(root: Path, dirs: list[str]) -> str:
    """One digest over every stage's graphs (their weights are in ``files`` like every file)."""
    digest = hashlib.sha256()
    for d in dirs:
        for name in (PREFILL_FILE, DECODE_FILE, VERIFY_FILE):
            if (root / d / name).is_file():
                digest.update(sha256_file(root / d / name).encode())
    return digest.hexdigest()
