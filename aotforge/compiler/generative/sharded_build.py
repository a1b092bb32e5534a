"""The sharded text-generation build, tensor- or pipeline-parallel: the export of ``build.py`` once per shard, one
artifact, the one tail.

Load the causal LM -> the split (a :class:`Sharding`: ``tp_build``'s ranks, ``pp_build``'s stages) -> for each
shard: its part of the model -> export -> the target's rewrites -> ``ranks/<r>/`` or ``stages/<s>/`` with its graphs
and weights -> the one build tail (``compiler.build_tail.compile_and_store``) with :class:`ShardWork`: each shard's
compile through the build cache in the isolated worker, the shards loaded as one model (a process each), token-exact
validation against the unsharded source model, benchmark, manifest, store. A rebuild with nothing changed is a
direct cache hit (``compiler.build_direct``) that runs none of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file
from aotforge.compiler.build_direct import DirectPlan
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import (
    ArtifactPlace,
    Checked,
    Compiled,
    Progress,
    TailJob,
    key_toolchain,
    place_artifact,
)
from aotforge.compiler.builder import isolation_of
from aotforge.compiler.compile_cache import CacheKey
from aotforge.compiler.generative.benchmark import benchmark_generation
from aotforge.compiler.generative.build import (
    _backend,
    _decode_attention,
    _dump_compiled,
    _target_options,
    _validator,
    export_and_store,
)
from aotforge.compiler.generative.decoder_stage import ShardRequest
from aotforge.compiler.generative.export import decoder_spec, save_shared
from aotforge.compiler.generative.export_cache import export_cache_dir
from aotforge.compiler.generative.graph_passes import backend_target_passes, graph_passes_of
from aotforge.compiler.generative.graph_stage import exported_graphs, pass_graphs
from aotforge.compiler.generative.graphs import unsupported
from aotforge.compiler.generative.pass_list import decoder_pass_options
from aotforge.compiler.generative.source import CausalLM, load_causal_lm
from aotforge.compiler.generative.weight_calibration import calibrated_source, weight_only_params
from aotforge.compiler.isolation import run_isolated
from aotforge.compiler.option_flags import flag_name
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import (
    PREFILL_FILE,
    TEXT_GENERATION,
    WEIGHTS_FILE,
    DecoderSpec,
    prefill_io,
)
from aotforge.core.errors import OptionsError, UnsupportedModelError
from aotforge.core.target_record import TargetRecord
from aotforge.passes import DEFAULT_PRESET
from aotforge.targets import get_target, shard_runtime, sharded_targets
from aotforge.targets.base import CompileResult, GenerativeBackend, Target
from aotforge.targets.generative.runner import GenerativeRunner

#: The isolated compile's entry (``generative.decoder_stage``).
SHARD_CALL = "aotforge.compiler.generative.decoder_stage:compile_shards"


@dataclasses.dataclass(frozen=True)
class Split:
    """A causal LM cut into ``degree`` shards: each shard's part of the model, and the record of the cut."""

    degree: int
    #: ``shard -> (its part of the model, its cache geometry, what the progress line says of it)``
    shard: Callable[[int], tuple[Any, DecoderSpec, str]]
    #: ``(shard folders, their specs, their weight bytes) -> target.info[kind]``
    record: Callable[[list[str], list[DecoderSpec], dict[str, int]], dict[str, Any]]
    #: ``shard's model -> what its prefill is traced under`` (a sequence-parallel rank's split); None: nothing
    prefill_scope: Callable[[Any], AbstractContextManager[Any]] | None = None
    #: what else decides each shard's part beside the whole model, the kind, the degree and the index (the export
    #: cache's key: ``generative.export_cache``)
    tag: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Sharding:
    """What a tensor- or pipeline-parallel build does its own way; the rest is :func:`build_sharded`'s."""

    #: ``targets.SHARD_KINDS``: the ``GenerationOptions`` field of the degree, the ``GenerativeBackend`` field of
    #: the runtime and the ``target.info`` key of the record
    kind: str
    #: the shards' folder in the artifact (``ranks``, ``stages``) and what one is called
    folder: str
    noun: str
    #: ``(causal LM, its spec, the build's options (the degree: ``opts.generation.<kind>``), its name) -> the split``
    split: Callable[[Any, DecoderSpec, BuildOptions, str], Split]
    #: ``(artifact dir, target record) -> the shards as one step engine`` (a process each)
    engine: Callable[[Path, TargetRecord], Any]
    #: options this kind refuses beside those every sharded build does
    refuse: Callable[[BuildOptions], None] | None = None
    #: whether its shards take the weight-only passes (``--precision int4/int8``): a stage holds whole layers, so
    #: each weight is quantized as the unsharded build quantizes it; a rank's slices are not (yet)
    weight_only: bool = False

    @property
    def flag(self) -> str:
        return flag_name(f"generation.{self.kind}")


def build_sharded(
    model: Any, opts: BuildOptions, say: Progress, sharding: Sharding, direct: DirectPlan | None = None
) -> BuildResult:
    """Compile a causal LM as ``opts.generation.<kind>`` shard graphs in one artifact (``load(path).generate``)."""
    started = time.perf_counter()
    target = get_target(opts.target)
    opts = decoder_pass_options(opts)
    _refuse(opts, sharding)
    backend = _backend(opts, target)
    # One intra-op thread a shard unless the user sets it: the shards are the parallelism.
    target_opts = _target_options(
        dataclasses.replace(opts, target_options={"intra_op_threads": 1, **opts.target_options}), target, backend
    )

    def export(stage: Path) -> tuple[CausalLM, TailJob]:
        return _export(model, opts, say, sharding, target, target_opts, backend, stage)

    return export_and_store(opts, target, direct, started, say, export)


def _export(
    model: Any,
    opts: BuildOptions,
    say: Progress,
    sharding: Sharding,
    target: Target,
    target_opts: Any,
    backend: GenerativeBackend,
    stage: Path,
) -> tuple[CausalLM, TailJob]:
    """Each shard's graphs into ``stage/<folder>/<i>/`` (exported, through the target's rewrites), and the tail's
    job for them."""
    say("loading the causal LM")
    source = load_causal_lm(model, opts.name)
    spec = decoder_spec(source.model, opts.generation.max_seq_len, opts.generation.max_batch)
    why = unsupported(source.model.config, spec.max_seq_len)
    if why:
        raise UnsupportedModelError(f"{source.name} cannot be built for {opts.target}: {why}")
    if backend.plan is not None:  # options the target cannot honour are refused before the export
        backend.plan(spec, target_opts)
    # Weight-only int4/int8 as the unsharded build: calibrated weights (the source stays the fp32 reference) are
    # split, and each shard's graphs go through the same passes.
    weight_only = weight_only_params(backend_target_passes(opts, target, backend)[1])
    if weight_only is not None and (weight_only.layers_8bit or weight_only.sensitive_layers_8bit):
        raise OptionsError(
            f"{sharding.flag}: weight-only layers_8bit / sensitive_layers_8bit name the whole decoder's layers, which "
            f"each {sharding.noun} graph numbers from 0: drop them, or build with {sharding.flag} 1"
        )
    exported, opts, pass_entries = calibrated_source(source, opts, weight_only, say)
    graph_passes = graph_passes_of(opts, target, backend)
    split = sharding.split(exported, spec, opts, source.name)
    place = place_artifact(opts.out, opts.name or source.name, opts.version, opts.target, plots=opts.benchmark.plots)
    verify_width = opts.generation.speculative_k + 1 if opts.generation.speculative_k else 0
    attention, plain_why = _decode_attention(backend, source.model, spec)
    dirs, specs, weights, ir_files, opset = [], [], {}, [], 0
    export_dir = export_cache_dir(opts.export_cache_dir, opts.cache_dir)
    for i in range(split.degree):
        part, shard_spec, what = split.shard(i)
        rel = f"{sharding.folder}/{i}"
        (stage / rel).mkdir(parents=True)
        scope = split.prefill_scope(part) if split.prefill_scope is not None else None
        # The part is a function of the model that was split (calibrated where a method scales weights) and this
        # tag: the export cache keys that model with it.
        tag = {"kind": sharding.kind, "degree": split.degree, "index": i, "split": split.tag}
        k = opts.generation.speculative_k
        graphs = exported_graphs(
            export_dir, exported, shard_spec, place.name, attention, k, say, part=part, prefill_scope=scope,
            shard=tag, what=what,
        )  # fmt: skip
        opset = graphs[PREFILL_FILE].opset_imports.get("", 0)
        entries, _ = pass_graphs(graphs, shard_spec, backend, graph_passes, say, f"{rel}/", opts.passes.dump_ir)
        pass_entries += entries
        if opts.passes.dump_ir is not None:
            _dump_compiled(graphs, opts.passes.dump_ir / rel, say)
        weights[str(i)] = save_shared(graphs, stage / rel)["weights_file_bytes"]
        ir_files += [f"{rel}/{name}" for name in (*graphs, WEIGHTS_FILE)]
        dirs.append(rel)
        specs.append(shard_spec)
        del part, graphs
    for rel, file in sorted(source.files.items()):
        shutil.copyfile(file, stage / rel)
    info = {
        "device": "cpu",
        "options": dataclasses.asdict(target_opts),
        "task": TEXT_GENERATION,
        "decoder": spec.to_dict(),
        "decode_attention": attention,
        **({"decode_attention_plain_because": plain_why} if plain_why else {}),
        sharding.kind: split.record(dirs, specs, weights),
        "weights": {"weights_file_bytes": sum(weights.values()), f"per_{sharding.noun}_bytes": weights},
        **(
            {"speculative": {"max_tokens": opts.generation.speculative_k, "verify_width": verify_width}}
            if verify_width
            else {}
        ),
    }
    work = ShardWork(
        kind=sharding.kind,
        noun=sharding.noun,
        spec=spec,
        shards=tuple(dirs),
        ir_files=tuple(ir_files),
        kept=tuple(sorted(source.files)),
        info=info,
        ir={"sha256": _graphs_sha(stage, ir_files), "opset": opset},
        weight_bytes=sum(weights.values()),
        validate=_validator(source, spec, opts, any(e.get("changes_numerics") for e in pass_entries)),
        bench=opts.benchmark.bench,
        engine=sharding.engine,
    )
    return source, _job(place, target, target_opts, work, source, opts, pass_entries)


def _job(
    place: ArtifactPlace,
    target: Target,
    target_opts: Any,
    work: ShardWork,
    source: CausalLM,
    opts: BuildOptions,
    passes: list[dict[str, Any]],
) -> TailJob:
    toolchain = key_toolchain(opts.target, target.probe())
    return TailJob(
        place=place,
        target=target,
        target_options=target_opts,
        work=work,
        source={"format": source.format, "sha256": source.sha256, "task": TEXT_GENERATION, **source.details},
        passes=passes,
        toolchain=toolchain,
        cache_dir=opts.cache_dir,
        build_extra={"toolchain_key": toolchain},
        isolation=isolation_of(opts),
    )


@dataclasses.dataclass(frozen=True)
class ShardWork:
    """The build tail's work for a sharded artifact (``build_tail.TailWork``): each shard's compile through the build
    cache (isolated), the shards loaded as one model (a process each), token-exact validation against the
    unsharded source model."""

    kind: str
    noun: str
    spec: DecoderSpec
    #: the shards' folders in the stage (``ranks/0`` ...)
    shards: tuple[str, ...]
    #: the staged files the compile reads (each shard's graphs and weights), which key the build cache, and the
    #: staged files it keeps beside them (a tokenizer)
    ir_files: tuple[str, ...]
    kept: tuple[str, ...]
    info: Mapping[str, Any]
    ir: Mapping[str, Any]
    weight_bytes: int
    #: ``(runner, name, say) -> the validation record``: greedy tokens against the unsharded source model, gated
    #: where the weights are fp32, quality-gated where the passes change numerics (``build._validator``)
    validate: Callable[[Any, str, Progress], dict[str, Any]]
    bench: bool
    engine: Callable[[Path, TargetRecord], Any]

    def cache_key(self, toolchain: Mapping[str, str], passes: Sequence[Mapping[str, Any]]) -> CacheKey:
        return CacheKey(self.ir_files, {"task": TEXT_GENERATION, "info": dict(self.info)}, toolchain, passes, self.kept)

    def compile(self, job: TailJob, stage: Path, say: Progress) -> Compiled:
        """Each shard's compile (``ShardRuntime.compile``) through the build cache, in the spawned worker with the
        deadline where isolation is on; the shards' sessions open in their own processes at ``check``."""
        request = ShardRequest(
            target=job.target.name,
            kind=self.kind,
            options=job.target_options,
            stage=stage,
            cache_dir=job.cache_dir,
            key=self.cache_key(job.toolchain, job.passes),
            shards=self.shards,
        )
        stage_name = f"the {job.target.name} compile"
        result = run_isolated(SHARD_CALL, request, stage=stage_name, limits=job.isolation, say=say, worker=job.worker)
        data = result["compiled"]
        return Compiled(CompileResult(tuple(data["files"]), data["target_info"], data["toolchain"]), result["cache"])

    def target_info(self, stage: Path, compiled: CompileResult) -> dict[str, Any]:
        return {**compiled.target_info, **self.info}

    def extra_passes(self, compiled: CompileResult) -> list[dict[str, Any]]:
        return []

    def check(self, job: TailJob, stage: Path, record: TargetRecord, compiled: Compiled, say: Progress) -> Checked:
        say(f"starting {len(self.shards)} {self.noun} processes")
        engine = self.engine(stage, record)
        runner = GenerativeRunner(engine)
        try:
            validation = self.validate(runner, job.place.name, say)
            bench = None
            if self.bench:
                say("benchmarking generation")
                bench = {"generation": benchmark_generation(runner, self.spec, self.weight_bytes)}
        finally:
            engine.close()
        return Checked(validation, bench)

    def ir_record(self, stage: Path) -> dict[str, Any]:
        return dict(self.ir)

    def io_record(self) -> dict[str, Any]:
        return prefill_io(self.spec).to_dict()


def _refuse(opts: BuildOptions, sharding: Sharding) -> None:
    """What a sharded build does not do (yet), refused by name before any work."""
    flag = sharding.flag
    if shard_runtime(opts.target, sharding.kind) is None:
        have = ", ".join(sharded_targets(sharding.kind))
        raise OptionsError(
            f"{flag}: {opts.target} has no {sharding.noun} runtime yet (only {have}): build it with {flag} 1"
        )
    if sharding.refuse is not None:
        sharding.refuse(opts)
    if tuple(opts.passes.names) not in ((DEFAULT_PRESET,), ()) and not sharding.weight_only:
        raise OptionsError(f"{flag} builds are fp32 for now: drop --precision / --passes, or build with {flag} 1")
    if opts.prepare_only:
        raise OptionsError(f"{flag} builds are not bundled (--prepare-only): build on the serving host")


def _graphs_sha(stage: Path, ir_files: Sequence[str]) -> str:
    """One digest over every shard's graphs (their weights are in ``files`` like every file)."""
    digest = hashlib.sha256()
    for rel in ir_files:
        if rel.endswith(".onnx"):
            digest.update(sha256_file(stage / rel).encode())
    return digest.hexdigest()
