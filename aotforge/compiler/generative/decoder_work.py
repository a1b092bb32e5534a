"""The tail's work for a text-generation artifact (``build_tail.TailWork``): prefill / decode (/ verify) graphs over
one copy of the weights, compiled by the target's generative backend, validated token for token, timed by generating.

A build (``generative.build``) and a bundle's finish (``generative.bundle_finish``) differ only in what they hand
over: the staged files, what the backend's compile takes besides them, and how generation is validated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.compiler.build_tail import Checked, Compiled, Progress, TailJob
from aotforge.compiler.compile_cache import CacheKey, compile_cached
from aotforge.compiler.generative.benchmark import benchmark_generation
from aotforge.compiler.isolation import run_isolated
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec, prefill_io
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult, DecoderInputs, GenerativeBackend

#: The isolated compile's entry (``generative.decoder_stage``) and the modules its worker imports ahead.
STAGE_CALL = "aotforge.compiler.generative.decoder_stage:compile_decoder"
STAGE_PRELOAD = ("aotforge.compiler.generative.decoder_stage",)


@dataclasses.dataclass(frozen=True)
class DecoderWork:
    """What a text-generation artifact's tail compiles, records and checks."""

    backend: GenerativeBackend
    spec: DecoderSpec
    #: Staged files the backend compiles from (the graphs and their weights; a bundle's safetensors), which key
    #: the build cache, and the staged files it keeps beside them (a tokenizer).
    ir_files: tuple[str, ...]
    kept: tuple[str, ...]
    #: What the compile takes besides the staged files (``verify_width``, ``passes``): keyed too.
    inputs: DecoderInputs
    #: The manifest's ``target.info`` beside the compile's (decode attention, fusions, speculative).
    info: Mapping[str, Any]
    #: ``target.info.weights`` from the compiled stage: the file the runner reads the weights from, its bytes.
    stored_weights: Callable[[Path], Mapping[str, Any]]
    #: The manifest's ``ir`` (a digest over the graphs, the opset).
    ir: Mapping[str, Any]
    #: ``(runner, artifact name, say) -> the manifest's validation``: greedy tokens against the source (or the
    #: references a bundle carries), quality where the passes change numerics; raises on a failure.
    validate: Callable[[Any, str, Progress], dict[str, Any]]
    bench: bool
    #: ``DecoderInputs.modules`` made from the stage (a bundle's torch modules, which neuron traces): not
    #: picklable, so a compile that takes them runs in this process.
    modules: Callable[[Path], Mapping[str, Any] | None] | None = None
    #: What the compile leaves redundant in the stage (a bundle's safetensors, once traced).
    after_compile: Callable[[Path], None] | None = None

    def cache_key(self, toolchain: Mapping[str, str], passes: Sequence[Mapping[str, Any]]) -> CacheKey:
        compile_key = {"verify_width": self.inputs.verify_width, "passes": _plain(self.inputs.passes)}
        io = {"task": TEXT_GENERATION, "decoder": self.spec.to_dict(), "compile": compile_key, "info": self.info}
        return CacheKey(self.ir_files, io, toolchain, passes, kept=self.kept)

    def compile(self, job: TailJob, stage: Path, say: Progress) -> Compiled:
        """The backend's compile through the build cache: in a spawned worker with the deadline where isolation is
        on (the artifact then loads here, for token validation against the source), else in this process."""
        key = self.cache_key(job.toolchain, job.passes)
        if job.isolation.enabled and self.modules is None and self.after_compile is None:
            request = DecoderRequest(
                target=job.target.name,
                options=job.target_options,
                stage=stage,
                cache_dir=job.cache_dir,
                key=key,
                spec=self.spec,
                inputs=self.inputs,
            )
            stage_name = f"the {job.target.name} compile"
            result = run_isolated(
                STAGE_CALL, request, stage=stage_name, limits=job.isolation, say=say, worker=job.worker
            )
            data = result["compiled"]
            compiled = CompileResult(tuple(data["files"]), data["target_info"], data["toolchain"])
            return Compiled(compiled, result["cache"])

        def run(options: Any) -> CompileResult:
            inputs = dataclasses.replace(self.inputs, modules=self.modules(stage)) if self.modules else self.inputs
            result = self.backend.compile(stage, self.spec, options, say, inputs)
            if self.after_compile is not None:
                self.after_compile(stage)
            return result

        compiled, cache = compile_cached(job.target, job.target_options, stage, job.cache_dir, key, run, say)
        return Compiled(compiled, cache)

    def target_info(self, stage: Path, compiled: CompileResult) -> dict[str, Any]:
        weights = dict(self.stored_weights(stage))
        return {
            **compiled.target_info,
            "task": TEXT_GENERATION,
            "decoder": self.spec.to_dict(),
            **self.info,
            "weights": weights,
        }

    def extra_passes(self, compiled: CompileResult) -> list[dict[str, Any]]:
        """Entries of the passes the backend applied itself while compiling (tvm's weight-only), with its stats."""
        stats = compiled.target_info.get("generative", {})
        return [
            {
                "name": name,
                "params": dataclasses.asdict(params),
                "stats": stats.get(name.replace("-", "_"), {}),
                "graph": "prefill+decode (target kernels)",
                "changes_numerics": True,
            }
            for name, params in self.inputs.passes.items()
        ]

    def check(self, job: TailJob, stage: Path, record: TargetRecord, compiled: Compiled, say: Progress) -> Checked:
        runner = self.backend.load(stage, record)
        validation = self.validate(runner, job.place.name, say)
        bench = None
        if self.bench:
            say("benchmarking generation")
            weights = _weight_bytes(stage) or int(record.info["weights"]["weights_file_bytes"])
            bench = {"generation": benchmark_generation(runner, self.spec, weights)}
        return Checked(validation, bench)

    def ir_record(self, stage: Path) -> dict[str, Any]:
        return dict(self.ir)

    def io_record(self) -> dict[str, Any]:
        return prefill_io(self.spec).to_dict()


@dataclasses.dataclass(frozen=True)
class DecoderRequest:
    """The isolated compile's request (``generative.decoder_stage``): the backend by its target's name."""

    target: str
    options: Any
    stage: Path
    cache_dir: Path | None
    key: CacheKey
    spec: DecoderSpec
    inputs: DecoderInputs


def _weight_bytes(stage: Path) -> int:
    """The weight files the artifact keeps, which its runner reads: the export's ``weights.data``, or what the
    target stores in its place (tvm: the packed ``tvm_weights.data``)."""
    return sum(p.stat().st_size for p in stage.glob("*.data"))


def _plain(value: Any) -> Any:
    """A compile argument as the cache key's JSON: pass parameters (dataclasses) by their fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
