"""Deployment targets, imported lazily by name so no vendor SDK is needed to import aotforge."""

from __future__ import annotations

import importlib

from aotforge.core.errors import OptionsError
from aotforge.targets.base import BuildContext, CompileResult, ProbeResult, Runner, Target

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


__all__ = ["TARGETS", "BuildContext", "CompileResult", "ProbeResult", "Runner", "Target", "get_target"]
