"""One populated op registry per process for torch's ONNX exporter (``torch.onnx.export(dynamo=True)``).

torch's exporter fills its registry of ATen -> ONNX functions from torchlib on every call
(``ONNXRegistry.from_torchlib``), which costs more CPU than a small graph's whole trace; a build exports several
graphs (prefill, decode, verify, each rank's or stage's) and a process may build many models. So the registry is
filled once per opset and each export gets its own copy: what an export registers on it (a custom translation
table) never reaches the next one, and the exported graphs are the same. Where torch's internals differ from what
this expects, nothing is changed and every export fills its own registry, as before.
"""

from __future__ import annotations

import threading
from typing import Any

_INSTALL = threading.Lock()
_FILL = threading.Lock()
_installed = [False]


def share_torchlib_registry() -> None:
    """Make ``ONNXRegistry.from_torchlib`` hand out copies of one registry per opset (idempotent, thread-safe)."""
    with _INSTALL:
        if _installed[0]:
            return
        _installed[0] = True
        try:
            from torch.onnx._internal.exporter import _registration
        except ImportError:
            return
        registry_type = getattr(_registration, "ONNXRegistry", None)
        fill = getattr(registry_type, "from_torchlib", None)
        if registry_type is None or fill is None or not isinstance(getattr(registry_type(), "functions", None), dict):
            return
        filled: dict[tuple[Any, ...], Any] = {}

        def from_torchlib(cls: Any, *args: Any, **kwargs: Any) -> Any:
            key = (cls, args, tuple(sorted(kwargs.items())))
            with _FILL:
                base = filled.get(key)
                if base is None:
                    base = filled[key] = fill.__func__(cls, *args, **kwargs)
            copy = object.__new__(cls)
            copy.__dict__.update(base.__dict__)
            copy.functions = {target: list(decomps) for target, decomps in base.functions.items()}
            return copy

        registry_type.from_torchlib = classmethod(from_torchlib)
