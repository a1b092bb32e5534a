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
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from aotforge.compiler.build_direct import DirectPlan
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import (
    ArtifactPlace,
    Progress,
    TailJob,
    key_toolchain,
    place_artifact,
)
from aotforge.compiler.builder import isolation_of
from aotforge.compiler.generative.build import (
    _backend,
    _decode_attention,
    _dump_compiled,
    _target_options,
    _validator,
    export_and_store,
)
from aotforge.compiler.generative.export import decoder_spec, save_shared
from aotforge.compiler.generative.export_cache import export_cache_dir
from aotforge.compiler.generative.graph_passes import backend_target_passes, graph_passes_of
from aotforge.compiler.generative.graph_stage import exported_graphs, pass_graphs
from aotforge.compiler.generative.graphs import refuse_unsupported
from aotforge.compiler.generative.pass_list import decoder_pass_options
from aotforge.compiler.generative.shard_record import graphs_sha, shard_info
from aotforge.compiler.generative.shard_work import ShardWork
from aotforge.compiler.generative.source import CausalLM, load_causal_lm
from aotforge.compiler.generative.weight_calibration import calibrated_source, weight_only_params
from aotforge.compiler.option_flags import flag_name
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import (
    DECODE_FILE,
    PREFILL_FILE,
    TEXT_GENERATION,
    VERIFY_FILE,
    WEIGHTS_FILE,
    DecoderSpec,
)
from aotforge.core.errors import OptionsError
from aotforge.core.target_record import TargetRecord
from aotforge.passes import DEFAULT_PRESET
from aotforge.targets import generative_backend, get_target, shard_runtime, sharded_targets
from aotforge.targets.base import GenerativeBackend, ShardRuntime, Target


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
    #: ``shard -> (its part as the plain split has it, that split's tag)`` where only the prefill differs from the
    #: plain split (sequence parallelism): the decode and verify graphs are exported, and keyed, as the plain split's,
    #: so a build of each shares them; None: every graph from ``shard``'s part
    plain: Callable[[int], tuple[Any, dict[str, Any]]] | None = None


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
    refuse_sharded(opts, sharding)
    backend = _backend(opts, target)
    runtime = shard_runtime(opts.target, sharding.kind)
    assert runtime is not None, "refuse_sharded refused a target without this runtime"
    target_opts = sharded_target_options(opts, target, backend, runtime)

    def export(stage: Path) -> tuple[CausalLM, TailJob]:
        return export_shards(model, opts, say, sharding, target, target_opts, backend, stage)

    return export_and_store(opts, target, direct, started, say, export)


def sharded_target_options(
    opts: BuildOptions, target: Target, backend: GenerativeBackend, runtime: ShardRuntime
) -> Any:
    """The target's options of a sharded build: the user's over the shard runtime's defaults (onnxruntime: one
    intra-op thread a shard) over the backend's."""
    layered = {**runtime.target_defaults, **opts.target_options}
    return _target_options(dataclasses.replace(opts, target_options=layered), target, backend)


def export_shards(
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
    job for them (a sharded bundle's contents: ``sharded_bundle.prepare_sharded``)."""
    say("loading the causal LM")
    source = load_causal_lm(model, opts.name)
    spec = decoder_spec(source.model, opts.generation.max_seq_len, opts.generation.max_batch)
    refuse_unsupported(source.model.config, source.name, opts.target, spec.max_seq_len)
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
    attention, plain_why = _decode_attention(backend, source.model, spec)
    dirs, specs, weights, ir_files, opset = [], [], {}, [], 0
    export_dir = export_cache_dir(opts.export_cache_dir, opts.cache_dir)
    k = opts.generation.speculative_k

    def export_shard(i: int, part: Any, shard_spec: DecoderSpec, what: str) -> dict[str, Any]:
        # The part is a function of the model that was split (calibrated where a method scales weights) and this
        # tag: the export cache keys that model with it.
        tag = {"kind": sharding.kind, "degree": split.degree, "index": i, "split": split.tag}
        scope = split.prefill_scope(part) if split.prefill_scope is not None else None
        if split.plain is None:
            return exported_graphs(
                export_dir, exported, shard_spec, place.name, attention, k, say, part=part, prefill_scope=scope,
                shard=tag, what=what,
            )  # fmt: skip
        plain, plain_tag = split.plain(i)
        prefill = exported_graphs(
            export_dir, exported, shard_spec, place.name, attention, 0, say, part=part, prefill_scope=scope,
            shard=tag, what=what, files=(PREFILL_FILE,),
        )  # fmt: skip
        rest = exported_graphs(
            export_dir, exported, shard_spec, place.name, attention, k, say, part=plain,
            shard={**tag, "split": plain_tag}, what=what, files=(DECODE_FILE, VERIFY_FILE),
        )  # fmt: skip
        return {**prefill, **rest}

    for i in range(split.degree):
        part, shard_spec, what = split.shard(i)
        rel = f"{sharding.folder}/{i}"
        (stage / rel).mkdir(parents=True)
        graphs = export_shard(i, part, shard_spec, what)
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
    record = split.record(dirs, specs, weights)
    options = dataclasses.asdict(target_opts)
    info = shard_info(sharding.kind, sharding.noun, options, spec, attention, plain_why, record, weights, k)
    work = ShardWork(
        kind=sharding.kind,
        noun=sharding.noun,
        spec=spec,
        shards=tuple(dirs),
        specs=tuple(specs),
        ir_files=tuple(ir_files),
        kept=tuple(sorted(source.files)),
        info=info,
        ir={"sha256": graphs_sha(stage, ir_files), "opset": opset},
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


def refuse_sharded(opts: BuildOptions, sharding: Sharding) -> None:
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
    if opts.generation.speculative_k and not generative_backend(opts.target).speculative:
        raise OptionsError(f"--speculative-k: {opts.target} text-generation artifacts have no verify graph yet")
    if opts.prepare_only and generative_backend(opts.target).bundle_plan is None:
        raise OptionsError(
            f"{flag} builds are bundled (--prepare-only) for device targets only: build for {opts.target} on the "
            "serving host"
        )
