"""numpy <-> torch for the eager reference: 0-d arrays stay 0-d, ``ml_dtypes`` bfloat16 / float8 work.

``torch.from_numpy`` refuses ``ml_dtypes`` arrays and ``Tensor.numpy()`` refuses bfloat16 / float8
tensors, so those cross as raw integers of the same width and are viewed back on the other side.
``np.ascontiguousarray`` is avoided: it turns a 0-d array into a 1-d one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: ml_dtypes name -> (torch dtype name, the integer dtype of the same width they cross as).
_VIEWS = {
    "bfloat16": ("bfloat16", np.int16),
    "float8_e4m3fn": ("float8_e4m3fn", np.uint8),
    "float8_e5m2": ("float8_e5m2", np.uint8),
    "float8_e4m3fnuz": ("float8_e4m3fnuz", np.uint8),
    "float8_e5m2fnuz": ("float8_e5m2fnuz", np.uint8),
}


def to_torch(array: Any) -> Any:
    import torch

    value = np.require(np.asarray(array), requirements="C")
    view = _VIEWS.get(value.dtype.name) if value.dtype.kind == "V" else None
    if view is None:
        return torch.from_numpy(value)
    return torch.from_numpy(value.view(view[1])).view(getattr(torch, view[0]))


def to_numpy(tensor: Any) -> np.ndarray:
    import ml_dtypes

    tensor = tensor.detach().cpu()
    name = str(tensor.dtype).removeprefix("torch.")
    if name in _VIEWS:
        import torch

        raw = tensor.view(torch.int16 if _VIEWS[name][1] is np.int16 else torch.uint8).numpy()
        return raw.view(getattr(ml_dtypes, name))
    return np.asarray(tensor.numpy())
