"""The tensor-parallel text-generation build: the export of ``build.py`` once per rank, one artifact, the one tail.

Load the causal LM -> for each rank: its slice of the model (``tensor_parallel``) -> export -> the target's
rewrites -> ``ranks/<r>/`` with the rank's graphs and weights -> load the ranks as one model (a process each)
-> token-exact validation against the unsharded source model -> benchmark -> manifest -> store: from the
ranks' session settings on, the one build tail (``compiler.build_tail.compile_and_store``) with :class:`RankWork`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.store import staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import (
    Checked,
    Compiled,
    Progress,
    TailJob,
    compile_and_store,
    key_toolchain,
    place_artifact,
)
from aotforge.compiler.compile_cache import CacheKey
from aotforge.compiler.generative.benchmark import benchmark_generation
from aotforge.compiler.generative.build import _backend, _decode_attention, _target_options
from aotforge.compiler.generative.export import decoder_spec, export_graphs, export_verify, save_shared
from aotforge.compiler.generative.graphs import unsupported
from aotforge.compiler.generative.source import load_causal_lm
from aotforge.compiler.generative.tensor_parallel import Layout, layout, rank_model
from aotforge.compiler.generative.validation import validate_generation
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import (
    DECODE_FILE,
    PREFILL_FILE,
    TEXT_GENERATION,
    VERIFY_FILE,
    WEIGHTS_FILE,
    DecoderSpec,
    prefill_io,
)
from aotforge.core.errors import OptionsError, UnsupportedModelError
from aotforge.core.target_record import TargetRecord
from aotforge.passes import DEFAULT_PRESET
from aotforge.targets import get_target
from aotforge.targets.base import CompileResult
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
    spec = decoder_spec(source.model, opts.generation.max_seq_len, opts.generation.max_batch)
    why = unsupported(source.model.config, spec.max_seq_len)
    if why:
        raise UnsupportedModelError(f"{source.name} cannot be built for {opts.target}: {why}")
    plan = layout(source.model, opts.generation.tensor_parallel, source.name)
    rank_spec = dataclasses.replace(spec, kv_heads=plan.kv_heads // plan.degree, vocab=plan.vocab_shard)
    place = place_artifact(opts.out, opts.name or source.name, opts.version, opts.target, plots=False)
    verify_width = opts.generation.speculative_k + 1 if opts.generation.speculative_k else 0
    with staging_dir(opts.out) as stage:
        attention, plain_why = _decode_attention(backend, source.model, spec)
        ranks, weights, opset = [], {}, 0
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
            ranks.append(f"ranks/{rank}")
            del shard, graphs
        for rel, file in sorted(source.files.items()):
            shutil.copyfile(file, stage / rel)
        info = {
            "device": "cpu",
            "options": dataclasses.asdict(target_opts),
            "task": TEXT_GENERATION,
            "decoder": spec.to_dict(),
            "decode_attention": attention,
            **({"decode_attention_plain_because": plain_why} if plain_why else {}),
            "tensor_parallel": _tp_record(plan, ranks, rank_spec, weights),
            "weights": {"weights_file_bytes": sum(weights.values()), "per_rank_bytes": weights},
            **(
                {"speculative": {"max_tokens": opts.generation.speculative_k, "verify_width": verify_width}}
                if verify_width
                else {}
            ),
        }
        work = RankWork(
            spec=spec,
            ranks=tuple(ranks),
            info=info,
            ir={"sha256": _graphs_sha(stage, ranks), "opset": opset},
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
        manifest = compile_and_store(job, stage, started, say)
    return BuildResult(place.path_of(manifest), manifest)


@dataclasses.dataclass(frozen=True)
class RankWork:
    """The build tail's work for a tensor-parallel artifact (``build_tail.TailWork``): each rank's session settings,
    the ranks loaded as one model (a process each), token-exact validation against the unsharded source model."""

    spec: DecoderSpec
    ranks: tuple[str, ...]
    info: Mapping[str, Any]
    ir: Mapping[str, Any]
    weight_bytes: int
    model: Any
    opts: BuildOptions

    def cache_key(self, toolchain: Mapping[str, str], passes: Sequence[Mapping[str, Any]]) -> CacheKey:
        files = tuple(f"{rank}/{name}" for rank in self.ranks for name in (PREFILL_FILE, DECODE_FILE, WEIGHTS_FILE))
        return CacheKey(files, {"task": TEXT_GENERATION, "info": dict(self.info)}, toolchain, passes)

    def compile(self, job: TailJob, stage: Path, say: Progress) -> Compiled:
        """Each rank's settings file; the sessions open in the rank processes that have the all-reduce (check)."""
        toolchain: Mapping[str, str] = {}
        for rank in self.ranks:
            toolchain = compile_rank(stage / rank, job.target_options)
        return Compiled(CompileResult((), {}, toolchain), cache=None)

    def target_info(self, stage: Path, compiled: CompileResult) -> dict[str, Any]:
        return dict(self.info)

    def extra_passes(self, compiled: CompileResult) -> list[dict[str, Any]]:
        return []

    def start(self, stage: Path, record: TargetRecord) -> Any:
        """The ranks as one step engine, a process each (``pp_build.StageWork``: the stages)."""
        return RankedEngine(stage, record)

    def check(self, job: TailJob, stage: Path, record: TargetRecord, compiled: Compiled, say: Progress) -> Checked:
        say(f"starting {len(self.ranks)} processes")
        engine = self.start(stage, record)
        runner = GenerativeRunner(engine)
        opts = self.opts
        try:
            say("validating greedy generation against transformers (the unsharded model)")
            validation = validate_generation(
                self.model, runner, self.spec, seed=opts.validation.seed, tolerance=opts.validation.tolerance,
                min_agreement=opts.generation.min_token_agreement, name=job.place.name, gate=True,
            )  # fmt: skip
            bench = None
            if opts.benchmark.bench:
                say("benchmarking generation")
                bench = {"generation": benchmark_generation(runner, self.spec, self.weight_bytes)}
        finally:
            engine.close()
        return Checked(validation, bench)

    def ir_record(self, stage: Path) -> dict[str, Any]:
        return dict(self.ir)

    def io_record(self) -> dict[str, Any]:
        return prefill_io(self.spec).to_dict()


def _refuse(opts: BuildOptions) -> None:
    """What this first tensor-parallel line does not do yet, refused before any work."""
    if opts.target not in TP_TARGETS:
        raise OptionsError(
            f"--tensor-parallel: {opts.target} has no rank runtime yet (only {', '.join(TP_TARGETS)}): "
            "build it with --tensor-parallel 1"
        )
    if tuple(opts.passes.names) not in ((DEFAULT_PRESET,), ()):
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
