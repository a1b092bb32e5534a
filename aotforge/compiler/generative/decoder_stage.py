"""A text-generation compile as one isolated request (``compiler.isolation``): the backend compiles the staged
graphs (through the build cache) in a spawned worker with the build's deadline and memory limit, so a crash or a
hang there is an error, not the end of the build. The artifact is loaded and validated in the build's process,
against the source model, which the worker never holds.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from aotforge.compiler.compile_cache import compile_cached
from aotforge.targets import generative_backend, get_target
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
