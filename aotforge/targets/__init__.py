"""Deployment targets, imported lazily by name so no vendor SDK is needed to import aotforge.

The registry: a target is one folder, ``targets/<name>/``, named here by its ``Target`` class and, where it
builds text-generation artifacts, by the module of that folder whose ``BACKEND`` compiles and loads them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from aotforge.core.errors import OptionsError, UnsupportedModelError
from aotforge.targets.base import BuildContext, CompileResult, ProbeResult, Runner, Target

if TYPE_CHECKING:
    from aotforge.targets.generative.backend import GenerativeBackend

#: Target name -> "module:Class". A table, not an import-time registry.
TARGETS: dict[str, str] = {
    "tvm": "aotforge.targets.tvm.target:TvmTarget",
    "onnxruntime": "aotforge.targets.onnxruntime.target:OrtTarget",
    "tensorrt": "aotforge.targets.tensorrt.target:TensorRTTarget",
    "neuron": "aotforge.targets.neuron.target:NeuronTarget",
}

#: Target name -> the module of its folder whose ``BACKEND`` (a ``generative.backend.GenerativeBackend``)
#: compiles and loads the prefill / decode graphs; a target missing here has no text-generation path yet.
#: tensorrt and neuron are planned here, compiled and run on the device host (--prepare-only + aotforge finish).
GENERATIVE: dict[str, str] = {
    "onnxruntime": "aotforge.targets.onnxruntime.decoder",
    "tvm": "aotforge.targets.tvm.decoder.engine",
    "tensorrt": "aotforge.targets.tensorrt.generative",
    "neuron": "aotforge.targets.neuron.generative",
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


def generative_backend(name: str) -> GenerativeBackend:
    """What compiles and loads target ``name``'s prefill + decode graphs, or a refusal naming those there are."""
    dotted = GENERATIVE.get(name)
    if dotted is None:
        raise UnsupportedModelError(
            f"text-generation artifacts for {name} are not implemented yet; use --target {' or '.join(GENERATIVE)}"
        )
    backend: GenerativeBackend = importlib.import_module(dotted).BACKEND
    return backend


__all__ = [
    "GENERATIVE",
    "TARGETS",
    "BuildContext",
    "CompileResult",
    "ProbeResult",
    "Runner",
    "Target",
    "generative_backend",
    "get_target",
]
