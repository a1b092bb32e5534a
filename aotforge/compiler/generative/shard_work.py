"""The build tail's work for a sharded text-generation artifact (``build_tail.TailWork``), tensor- or
pipeline-parallel: each shard's compile through the build cache in the isolated worker, the shards loaded as one
model (a process each), token-exact validation against the unsharded source model, the benchmark, and what the
manifest records of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.compiler.build_tail import Checked, Compiled, Progress, TailJob
from aotforge.compiler.compile_cache import CacheKey
from aotforge.compiler.generative.benchmark import benchmark_generation
from aotforge.compiler.generative.decoder_stage import ShardRequest
from aotforge.compiler.isolation import run_isolated
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec, prefill_io
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult
from aotforge.targets.generative.runner import GenerativeRunner

#: The isolated compile's entry (``generative.decoder_stage``).
SHARD_CALL = "aotforge.compiler.generative.decoder_stage:compile_shards"


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
    #: each shard's cache geometry (a rank's: its 1/N of the KV heads and of the vocabulary)
    specs: tuple[DecoderSpec, ...]
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
            specs=tuple(spec.to_dict() for spec in self.specs),
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
