"""aotforge: compile a trained model ahead of time into a validated, benchmarked, versioned artifact.

The public API, resolved on first use so that ``import aotforge`` stays cheap (no torch, onnx or
target SDK is imported until a build or a load needs it)::

    import aotforge
    result = aotforge.build("model.onnx", target="onnxruntime")
    outputs = aotforge.load(result.path).run({"x": x})

Layers, from the bottom up (``tests/test_layering.py`` holds them): ``aotforge.core`` (errors, IO
spec, option parsing; imports nothing of aotforge) -> ``aotforge.passes`` and ``aotforge.targets``
(never each other) -> ``aotforge.artifacts`` (the format, the store, registries, the loader) ->
``aotforge.compiler`` (frontends, the build line, the CLI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aotforge.artifacts.loader import LoadedArtifact, load
    from aotforge.compiler.api import build, build_matrix
    from aotforge.compiler.build_result import BuildResult
    from aotforge.compiler.options import BuildOptions
    from aotforge.core.errors import AotforgeError

__all__ = ["AotforgeError", "BuildOptions", "BuildResult", "LoadedArtifact", "build", "build_matrix", "load"]

#: Public name -> the module that defines it.
_API = {
    "build": "aotforge.compiler.api",
    "build_matrix": "aotforge.compiler.api",
    "BuildResult": "aotforge.compiler.build_result",
    "BuildOptions": "aotforge.compiler.options",
    "AotforgeError": "aotforge.core.errors",
    "load": "aotforge.artifacts.loader",
    "LoadedArtifact": "aotforge.artifacts.loader",
}


def __getattr__(name: str) -> Any:
    import importlib

    try:
        module = _API[name]
    except KeyError:
        raise AttributeError(f"module 'aotforge' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
