"""Generative runtimes: the target-independent decoding loop and one step engine per target."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from aotforge.core.errors import UnsupportedModelError

if TYPE_CHECKING:
    from aotforge.targets.generative.backend import GenerativeBackend

#: Target -> the module whose ``BACKEND`` (a ``backend.GenerativeBackend``) compiles and loads the graphs.
#: A table read on use (no import-time registry); a target missing here has no generative path yet.
GENERATIVE_BACKENDS = {
    "onnxruntime": "aotforge.targets.onnxruntime.decoder",
    "tvm": "aotforge.targets.tvm.decoder.engine",
    # Planned here, compiled and run on the device host (--prepare-only + aotforge finish).
    "tensorrt": "aotforge.targets.tensorrt.generative",
    "neuron": "aotforge.targets.neuron.generative",
}


def generative_backend(target: str) -> GenerativeBackend:
    """What compiles and loads ``target``'s prefill + decode graphs, or a refusal."""
    dotted = GENERATIVE_BACKENDS.get(target)
    if dotted is None:
        raise UnsupportedModelError(
            f"text-generation artifacts for {target} are not implemented yet; use --target "
            f"{' or '.join(GENERATIVE_BACKENDS)}"
        )
    backend: GenerativeBackend = importlib.import_module(dotted).BACKEND
    return backend
