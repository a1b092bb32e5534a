"""Which decoder layer each weight matmul of a compiled graph belongs to, read from the graph alone.

A per-layer choice (8 bits for the layers most sensitive to 4) is made on the torch model, where layers have
indices; the targets see graphs whose matmuls have generated names (ONNX Runtime's packed Q/K/V, tvm's weight
arguments). What they do keep is order and shape: a decoder's weight matmuls come layer by layer, every layer
with the same sequence of weight shapes: with the model's layer count, position gives the layer, and the
shapes check that the graph is laid out that way.
"""

from __future__ import annotations

from collections.abc import Sequence


def layer_indices(shapes: Sequence[tuple[object, ...]], layers: int) -> list[int] | None:
    """The layer of each matmul (``shapes``: their weights' shapes in execution order, the head left out), or
    None when they are not ``layers`` repeats of one layer's sequence."""
    count = len(shapes)
    if layers < 1 or count % layers:
        return None
    period = count // layers
    if any(shapes[i] != shapes[i % period] for i in range(count)):
        return None
    return [i // period for i in range(count)]
