"""A text-generation compile as one isolated request (``compiler.isolation``): the backend compiles the staged
graphs (through the build cache) in a spawned worker with the build's deadline and memory limit, so a crash or a
hang there is an error, not the end of the build. The artifact is loaded and validated in the build's process,
against the source model, which the worker never holds. A sharded artifact's compile (:func:`compile_shards`) is
the same request over each rank's or stage's folder.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.compiler.compile_cache import CacheKey, compile_cached
from aotforge.core.decoder import DecoderSpec
from aotforge.targets import generative_backend, get_target, shard_runtime
from aotforge.targets.base import CompileResult

if TYPE_CHECKING:
    from aotforge.compiler.generative.decoder_work import DecoderRequest


def compile_decoder(request: DecoderRequest, channel: Any) -> dict[str, Any]:
    """In the worker: the backend's compile of ``request.stage``, through the build cache."""
    target = get_target(request.target)
    backend = generative_backend(request.target)
    channel.phase(f"the {target.name} compile")

    def run(options: Any) -> CompileResult:
        return backend.compile(request.stage, request.spec, options, channel.say, request.inputs)

    compiled, cache = compile_cached(
        target, request.options, request.stage, request.cache_dir, request.key, run, channel.say
    )
    return {"compiled": dataclasses.asdict(compiled), "cache": cache}


@dataclasses.dataclass(frozen=True)
class ShardRequest:
    """The isolated compile of a sharded artifact: each shard's folder (``ranks/<r>``, ``stages/<s>``) in the stage,
    compiled by the target's runtime of ``kind`` (``targets.SHARD_KINDS``)."""

    target: str
    kind: str
    options: Any
    stage: Path
    cache_dir: Path | None
    key: CacheKey
    shards: tuple[str, ...]
    #: each shard's ``DecoderSpec.to_dict()``
    specs: tuple[dict[str, Any], ...]


def compile_shards(request: ShardRequest, channel: Any) -> dict[str, Any]:
    """In the worker: every shard's compile (``ShardRuntime.compile``), through the build cache as one entry."""
    target = get_target(request.target)
    runtime = shard_runtime(request.target, request.kind)
    assert runtime is not None, "the build refused a target without this runtime before the export"
    channel.phase(f"the {target.name} compile")

    def run(options: Any) -> CompileResult:
        files: list[str] = []
        toolchain: dict[str, str] = {}
        info: dict[str, Any] = {}
        for shard, spec in zip(request.shards, request.specs, strict=True):
            compiled = runtime.compile(request.stage / shard, options, DecoderSpec.from_dict(spec), len(request.shards))
            files += [f"{shard}/{name}" for name in compiled.files]
            toolchain.update(compiled.toolchain)
            info.update(compiled.target_info)  # what every shard's compile says alike (the device)
        return CompileResult(tuple(files), info, toolchain)

    compiled, cache = compile_cached(
        target, request.options, request.stage, request.cache_dir, request.key, run, channel.say
    )
    return {"compiled": dataclasses.asdict(compiled), "cache": cache}
