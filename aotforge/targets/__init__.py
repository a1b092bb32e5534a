"""Deployment targets, imported lazily by name so no vendor SDK is needed to import aotforge.

The registry: a target is one folder, ``targets/<name>/``, and one line here naming its ``Target`` class; the
class names the module of its folder that builds text-generation artifacts, where it has one
(``Target.generative_module``).
"""

from __future__ import annotations

import importlib

from aotforge.core.errors import OptionsError, RankFailedError, UnsupportedModelError
from aotforge.targets.base import (
    BuildContext,
    CompileResult,
    GenerativeBackend,
    ProbeResult,
    Runner,
    ShardRuntime,
    Target,
)

#: Target name -> "module:Class". A table, not an import-time registry.
TARGETS: dict[str, str] = {
    "tvm": "aotforge.targets.tvm.target:TvmTarget",
    "onnxruntime": "aotforge.targets.onnxruntime.target:OrtTarget",
    "tensorrt": "aotforge.targets.tensorrt.target:TensorRTTarget",
    "neuron": "aotforge.targets.neuron.target:NeuronTarget",
}


def get_target(name: str) -> Target:
    """The target called ``name``; an unknown name lists the valid ones."""
    try:
        dotted = TARGETS[name]
    except KeyError:
        raise OptionsError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None
    module_name, _, cls_name = dotted.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    target: Target = cls()
    return target


def generative_targets() -> list[str]:
    """The targets that build text-generation artifacts (``Target.generative_module``), in the registry's order."""
    return [name for name in TARGETS if get_target(name).generative_module]


def generative_backend(name: str) -> GenerativeBackend:
    """What compiles and loads target ``name``'s prefill + decode graphs, or a refusal naming those there are."""
    backend = get_target(name).generative() if name in TARGETS else None
    if backend is None:
        raise UnsupportedModelError(
            f"text-generation artifacts for {name} are not implemented yet; use --target "
            f"{' or '.join(generative_targets())}"
        )
    return backend


#: The kinds of sharded text-generation artifacts (``GenerativeBackend`` fields, ``target.info`` keys, and
#: ``GenerationOptions`` fields giving their degree).
SHARD_KINDS = ("tensor_parallel", "pipeline_parallel")


def shard_runtime(name: str, kind: str) -> ShardRuntime | None:
    """Target ``name``'s runtime of ``kind`` (``SHARD_KINDS``) artifacts, None where it has none."""
    if kind not in SHARD_KINDS:
        raise ValueError(f"unknown shard kind {kind!r}; one of {', '.join(SHARD_KINDS)}")
    backend = get_target(name).generative() if name in TARGETS else None
    runtime: ShardRuntime | None = getattr(backend, kind) if backend is not None else None
    return runtime


def loaded_shard_runtime(name: str, kind: str) -> ShardRuntime:
    """``shard_runtime`` for an artifact being loaded: one of a target without that runtime is refused by name."""
    runtime = shard_runtime(name, kind)
    if runtime is None:
        what = kind.replace("_", "-")
        raise RankFailedError(f"{name} has no {what} runtime (only {', '.join(sharded_targets(kind))})")
    return runtime


def sharded_targets(kind: str) -> list[str]:
    """The targets that build and run ``kind`` artifacts, in the registry's order."""
    return [name for name in generative_targets() if shard_runtime(name, kind) is not None]


__all__ = [
    "TARGETS",
    "BuildContext",
    "CompileResult",
    "ProbeResult",
    "Runner",
    "SHARD_KINDS",
    "ShardRuntime",
    "Target",
    "generative_backend",
    "generative_targets",
    "get_target",
    "loaded_shard_runtime",
    "shard_runtime",
    "sharded_targets",
]
