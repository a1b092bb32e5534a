"""Constants of an ONNX IR graph: reading one as an array, registering one as an initializer.

Every rewrite that folds or adds a weight needs both; one helper keeps the name rules (share a constant of the same
name, or take a fresh one) the same across passes and targets.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The array of ``value`` when it is a constant (an initializer or a folded value), else None."""
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray, *, share: bool = False) -> ir.Value:
    """Register ``array`` as an initializer of ``graph`` named ``name`` and return its value.

    Where ``name`` is taken, ``share=True`` returns the existing initializer (scalars every rewrite of a graph uses
    alike); otherwise the new one gets the first free ``name_1``, ``name_2``, ... so nothing is overwritten.
    """
    if name in graph.initializers:
        if share:
            return graph.initializers[name]
        taken, k = set(graph.initializers), 1
        while f"{name}_{k}" in taken:
            k += 1
        name = f"{name}_{k}"
    tensor = ir.tensor(array, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value
