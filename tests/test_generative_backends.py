"""Every text-generation backend is one typed record (``targets.base.GenerativeBackend``) the build line reads."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from aotforge.compiler.generative.export import DECODE_ATTENTION
from aotforge.compiler.generative.graph_passes import GENERATIVE_PASSES
from aotforge.core.errors import UnsupportedModelError
from aotforge.targets import generative_targets
from aotforge.targets.base import DecoderInputs, GenerativeBackend
from aotforge.targets.generative import generative_backend

GENERATIVE = generative_targets()


@pytest.mark.parametrize("target", sorted(GENERATIVE))
def test_each_backend_module_gives_a_consistent_record(target: str) -> None:
    """Importable without the target's SDK; what it says it does, its hooks take."""
    backend = generative_backend(target)
    assert isinstance(backend, GenerativeBackend)
    assert backend.decode_attention in DECODE_ATTENTION
    # One typed call for every backend: what differs between them travels in DecoderInputs.
    hints = typing.get_type_hints(backend.compile)
    assert list(hints) == ["workdir", "spec", "options", "say", "inputs", "return"]
    assert hints["inputs"] is DecoderInputs and {f.name for f in dataclasses.fields(DecoderInputs)} >= {
        "verify_width",
        "passes",
        "modules",
    }
    assert backend.compile_passes <= GENERATIVE_PASSES and set(backend.pass_defaults) <= GENERATIVE_PASSES
    # A bundle's device host compiles what the bundle holds: both fields or neither.
    assert backend.graphs_from in ("", "onnx", "torch")
    assert (backend.bundle_plan is None) == (backend.graphs_from == "")


def test_the_device_targets_are_built_through_bundles_the_cpu_ones_here() -> None:
    bundled = {t for t in GENERATIVE if generative_backend(t).bundle_plan is not None}
    assert bundled == {"tensorrt", "neuron"}
    assert {t for t in GENERATIVE if generative_backend(t).speculative} == {"onnxruntime", "tvm"}


def test_a_target_without_a_backend_is_refused_naming_those_there_are() -> None:
    with pytest.raises(UnsupportedModelError, match="tvm or onnxruntime or tensorrt or neuron"):
        generative_backend("coreml")
