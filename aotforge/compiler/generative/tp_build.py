"""The tensor-parallel text-generation build: the build line of ``build.py`` once per rank, one artifact.

Load the causal LM -> for each rank: its slice of the model (``tensor_parallel``) -> export -> the target's
rewrites -> ``ranks/<r>/`` with the rank's graphs and weights -> load the ranks as one model (a process each)
-> token-exact validation against the unsharded source model -> benchmark -> manifest -> store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import build_record, key_toolchain, place_artifact, store_artifact
from aotforge.compiler.generative.benchmark import benchmark_generation
from aotforge.compiler.generative.build import Progress, _backend, _decode_attention, _target_options
from aotforge.compiler.generative.export import decoder_spec, export_graphs, export_verify, save_shared
from aotforge.compiler.generative.graphs import unsupported
from aotforge.compiler.generative.source import load_causal_lm
from aotforge.compiler.generative.tensor_parallel import Layout, layout, rank_model
from aotforge.compiler.generative.validation import validate_generation
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.toolchain import toolchain_versions
from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, TEXT_GENERATION, VERIFY_FILE, DecoderSpec, prefill_io
from aotforge.core.errors import OptionsError, UnsupportedModelError
from aotforge.core.target_record import TargetRecord
from aotforge.passes import DEFAULT_PRESET
from aotforge.targets import get_target
from aotforge.targets.generative.ranks import RankedEngine
from aotforge.targets.generative.runner import GenerativeRunner
from aotforge.targets.onnxruntime.tensor_parallel import compile_rank

#: Targets with a rank runtime (``targets/generative/ranks.py``).
TP_TARGETS = ("onnxruntime",)


def build_tensor_parallel(model: Any, opts: BuildOptions, say: Progress) -> BuildResult:
    """Compile a causal LM as ``opts.tensor_parallel`` rank graphs in one artifact (``load(path).generate``)."""
    started = time.perf_counter()
    _refuse(opts)
    target = get_target(opts.target)
    backend = _backend(opts, target)
    # One intra-op thread a rank unless the user sets it: the ranks are the parallelism.
    target_opts = _target_options(
        dataclasses.replace(opts, target_options={"intra_op_threads": 1, **opts.target_options}), target, backend
    )
    say("loading the causal LM")
    source = load_causal_lm(model, opts.name)
    spec = decoder_spec(source.model, opts.max_seq_len, opts.max_batch)
    why = unsupported(source.model.config, spec.max_seq_len)
    if why:
        raise UnsupportedModelError(f"{source.name} cannot be built for {opts.target}: {why}")
    plan = layout(source.model, opts.tensor_parallel, source.name)
    rank_spec = dataclasses.replace(spec, kv_heads=plan.kv_heads // plan.degree, vocab=plan.vocab_shard)
    place = place_artifact(opts.out, opts.name or source.name, opts.version, opts.target, plots=False)
    verify_width = opts.speculative_k + 1 if opts.speculative_k else 0
    with staging_dir(opts.out) as stage:
        attention, plain_why = _decode_attention(backend, source.model, spec)
        ranks, weights, toolchain, opset = [], {}, {}, 0
        for rank in range(plan.degree):
            say(f"exporting rank {rank} of {plan.degree}")
            rank_dir = stage / "ranks" / str(rank)
            rank_dir.mkdir(parents=True)
            shard = rank_model(source.model, plan, rank)
            prefill, decode = export_graphs(shard, rank_spec, place.name, attention)
            graphs, opset = {PREFILL_FILE: prefill, DECODE_FILE: decode}, prefill.opset_imports.get("", 0)
            if verify_width:
                graphs[VERIFY_FILE] = export_verify(shard, rank_spec, place.name, attention)
            for step in (backend.prepare_graphs, backend.rewrite_graphs):
                if step is not None:
                    step(graphs, rank_spec)
            weights[str(rank)] = save_shared(graphs, rank_dir)["weights_file_bytes"]
            toolchain = compile_rank(rank_dir, target_opts)
            ranks.append(f"ranks/{rank}")
            del shard, graphs
        for rel, file in sorted(source.files.items()):
            shutil.copyfile(file, stage / rel)
        settings = dataclasses.asdict(target_opts)
        info = {
            "device": "cpu",
            "options": settings,
            "task": TEXT_GENERATION,
            "decoder": spec.to_dict(),
            "decode_attention": attention,
            **({"decode_attention_plain_because": plain_why} if plain_why else {}),
            "tensor_parallel": _tp_record(plan, ranks, rank_spec, weights),
            "weights": {"weights_file_bytes": sum(weights.values()), "per_rank_bytes": weights},
            **(
                {"speculative": {"max_tokens": opts.speculative_k, "verify_width": verify_width}}
                if verify_width
                else {}
            ),
        }
        record = TargetRecord(target.name, settings, info)
        say(f"starting {plan.degree} rank processes")
        engine = RankedEngine(stage, record)
        runner = GenerativeRunner(engine)
        try:
            say("validating greedy generation against transformers (the unsharded model)")
            validation = validate_generation(
                source.model, runner, spec, seed=opts.seed, tolerance=opts.tolerance,
                min_agreement=opts.min_token_agreement, name=place.name, gate=True,
            )  # fmt: skip
            bench = None
            if opts.bench:
                say("benchmarking generation")
                bench = {"generation": benchmark_generation(runner, spec, sum(weights.values()))}
        finally:
            engine.close()
        manifest = Manifest(
            name=place.name,
            version=place.version,
            target=record,
            toolchain={**toolchain_versions(), **toolchain},
            source={"format": source.format, "sha256": source.sha256, "task": TEXT_GENERATION},
            ir={"sha256": _graphs_sha(stage, ranks), "opset": opset},
            passes=[],
            io=prefill_io(spec).to_dict(),
            validation=validation,
            benchmark=bench,
            files={},
            build=build_record(started, toolchain_key=key_toolchain(opts.target, target.probe())),
        )
        manifest = store_artifact(stage, manifest, place)
    return BuildResult(place.path_of(manifest), manifest)


def _refuse(opts: BuildOptions) -> None:
    """What this first tensor-parallel line does not do yet, refused before any work."""
    if opts.target not in TP_TARGETS:
        raise OptionsError(
            f"--tensor-parallel: {opts.target} has no rank runtime yet (only {', '.join(TP_TARGETS)}): "
            "build it with --tensor-parallel 1"
        )
    if tuple(opts.passes) not in ((DEFAULT_PRESET,), ()):
        raise OptionsError(
            "--tensor-parallel builds are fp32 for now: drop --precision / --passes, or build with --tensor-parallel 1"
        )
    if opts.prepare_only:
        raise OptionsError("--tensor-parallel builds are not bundled (--prepare-only): build on the serving host")


def _tp_record(plan: Layout, ranks: list[str], rank_spec: DecoderSpec, weights: dict[str, int]) -> dict[str, Any]:
    """``target.info.tensor_parallel``: the layout, where each rank's files are, and each rank's cache."""
    return {
        "degree": plan.degree,
        "layout": plan.to_dict(),
        "ranks": ranks,
        "decoder": rank_spec.to_dict(),
        "rank_weights_bytes": weights,
        "rank_kv_cache_bytes_per_slot": rank_spec.kv_cache_bytes(1),
    }


def _graphs_sha(stage: Path, ranks: list[str]) -> str:
    """One digest over every rank's graphs (their weights are in ``files`` like every file)."""
    digest = hashlib.sha256()
    for rank in ranks:
        for name in (PREFILL_FILE, DECODE_FILE, VERIFY_FILE):
            if (stage / rank / name).is_file():
                digest.update(sha256_file(stage / rank / name).encode())
    return digest.hexdigest()
