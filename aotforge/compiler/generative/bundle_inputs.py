"""What a text-generation bundle carries for the device host to compile, per target.

tensorrt compiles ONNX: the bundle holds the prefill and decode graphs over one ``weights.data``
(:class:`OnnxGraphs`). neuronx-cc has no ONNX frontend: the bundle holds the causal LM as safetensors and the
device host traces its prefill / decode torch modules per bucket (:class:`TorchModules`). The target's
generative backend names which (``GenerativeBackend.graphs_from``); everything else about a bundle is the same for both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from aotforge.artifacts.hashing import sha256_file
from aotforge.core.decoder import DecoderSpec


class BundleInputs(Protocol):
    """How one kind of bundle writes, checks on the CPU and hands over what the target compiles."""

    #: What writing them is called in the progress lines.
    writing: str

    def write(self, stage: Path, model: Any, spec: DecoderSpec, name: str, attention: str) -> tuple[dict, int]:
        """Write the inputs into ``stage``; returns the weights record and the ONNX opset (0: no ONNX)."""
        ...

    def cpu_engine(self, stage: Path, spec: DecoderSpec, model: Any, plan: Mapping[str, Any]) -> tuple[Any, str]:
        """A step engine over the written inputs on this CPU, and a line saying what it runs."""
        ...

    def modules(self, stage: Path) -> Mapping[str, Any] | None:
        """The torch modules the backend's ``compile`` traces (``DecoderInputs.modules``), None for ONNX graphs."""
        ...

    def after_compile(self, stage: Path) -> None:
        """Remove from the staged artifact what the compiled graphs made redundant."""
        ...

    def compiled_files(self, bundle: Path) -> list[str]:
        """The files the target compiles, relative to the bundle, in a fixed order."""
        ...


def bundle_inputs(graphs_from: str) -> BundleInputs:
    """The inputs a backend's ``graphs_from`` names ("onnx" or "torch")."""
    if graphs_from == "onnx":
        from aotforge.compiler.generative.onnx_inputs import OnnxGraphs

        return OnnxGraphs()
    from aotforge.compiler.generative.torch_inputs import TorchModules

    return TorchModules()


def inputs_sha(bundle: Path, graphs_from: str) -> str:
    """One digest over what the target compiles: the two graphs (their weights are in ``files``), or the weights."""
    digest = hashlib.sha256()
    for rel in bundle_inputs(graphs_from).compiled_files(bundle):
        digest.update(sha256_file(bundle / rel).encode())
    return digest.hexdigest()
