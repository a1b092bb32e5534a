"""How much each decoder layer costs at 4 bits: the ranking that picks the layers a mixed build keeps at 8.

As the int8 search does for encoders (``passes/quantization_search.py``: one node at a time, its error against
the float model), each layer's matmuls are rounded to the targets' int4 alone, the rest of the model kept as it
is, and the cost is the mean KL(fp32 || that model) of the next-token distribution over the calibration text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aotforge.compiler.generative.calibrate import layer_linears, rtn_int4


def layer_costs(reference: Any, model: Any, windows: list[np.ndarray], group: int) -> list[float]:
    """Per layer of ``model`` (the weights the targets will round), the mean KL per token when only that layer's
    matmuls are rounded to int4 in blocks of ``group``; ``reference`` is the fp32 model."""
    import torch

    batches = [torch.from_numpy(np.asarray(w, dtype=np.int64))[None] for w in windows]
    with torch.inference_mode():
        ref = [torch.log_softmax(reference(input_ids=b).logits.float(), -1) for b in batches]
        costs = []
        for layer in layer_linears(model):
            kept = [lin.weight().clone() for lin in layer]
            for lin in layer:
                if lin.weight().shape[1] % group == 0:
                    lin.set_weight(rtn_int4(lin.weight(), group))
            kl, count = 0.0, 0
            for b, p in zip(batches, ref, strict=True):
                q = torch.log_softmax(model(input_ids=b).logits.float(), -1)
                kl += float((p.exp() * (p - q)).sum())
                count += b.shape[1]
            for lin, w in zip(layer, kept, strict=True):
                lin.set_weight(w)
            costs.append(kl / count)
    return costs


def most_sensitive(costs: list[float], count: int) -> list[int]:
    """The ``count`` layers of highest cost, in layer order."""
    return sorted(sorted(range(len(costs)), key=lambda i: -costs[i])[:count])
