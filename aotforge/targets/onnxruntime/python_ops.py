"""onnxruntime-extensions' Python-op registry, imported without the rest of the package.

The rank and stage graphs' collectives run as onnxruntime-extensions Python ops (``onnx_op``, ``PyCustomOpDef``, the
library ``get_library_path`` names), which live in its ``_ocos`` module over the native library. ``import
onnxruntime_extensions`` also runs the package's ``__init__``, which imports its tokenizer converters and, with them,
transformers and torch: seconds of CPU in every rank or stage process, for those three names. :func:`registry`
loads ``_ocos`` alone; a later full import of the package reuses that module (``sys.modules``), so the library is
loaded, and its ops registered, once either way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from aotforge.core.errors import TargetUnavailableError

PACKAGE = "onnxruntime_extensions"
_REGISTRY = f"{PACKAGE}._ocos"


def registry() -> ModuleType:
    """The package's ``_ocos`` module (``Opdef.declare`` is its ``onnx_op``), or a refusal naming the package."""
    if _REGISTRY in sys.modules:  # loaded here before, or by a full import of the package
        return sys.modules[_REGISTRY]
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        raise TargetUnavailableError(
            "the sharded onnxruntime artifacts run their collectives through onnxruntime-extensions: "
            "pip install onnxruntime-extensions"
        )
    # The package as a bare module (its __path__, not its __init__) while its submodule imports, then gone again,
    # so that an `import onnxruntime_extensions` later runs the real __init__.
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module(_REGISTRY)
    finally:
        del sys.modules[PACKAGE]


def library_path() -> str:
    """The native library that runs the registered Python ops (``get_library_path``)."""
    return str(registry().get_library_path())


def declare(op_type: str, inputs: list[int], outputs: list[int]) -> Callable[[Callable[..., Any]], Any]:
    """``onnx_op(op_type=..., inputs=..., outputs=...)``: a decorator registering a function as the op."""
    return registry().Opdef.declare(op_type=op_type, inputs=inputs, outputs=outputs)  # type: ignore[no-any-return]


def dtypes() -> Any:
    """``PyCustomOpDef``, whose ``dt_*`` constants type an op's inputs and outputs."""
    return registry().PyCustomOpDef
