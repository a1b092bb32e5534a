"""The all-reduce of a tensor-parallel rank graph, as a torch op that exports to one ONNX node.

``torch.ops.aotforge.all_reduce(x)`` is the identity in torch (a rank module is only ever traced, never run
for its numbers) and exports as ``ai.onnx.contrib::AllReduce``: the domain onnxruntime-extensions runs Python
ops from, so the rank's runtime supplies the collective (``targets/onnxruntime/tensor_parallel.py``) and the
graph stays one graph per rank, not a graph cut at every all-reduce.
"""

from __future__ import annotations

from typing import Any

import torch

#: The ONNX node a rank graph's all-reduce becomes (a runtime matches both).
DOMAIN, OP_TYPE = "ai.onnx.contrib", "AllReduce"


@torch.library.custom_op("aotforge::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the ranks; traced only, so the identity here."""
    return x.clone()


@all_reduce.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_reduce_onnx(x: Any) -> Any:
    """The ONNX translation: one ``AllReduce`` node of the contrib domain, float in, float out."""
    import onnx
    from onnxscript.values import Op, Opset

    param = onnx.defs.OpSchema.FormalParameter
    schema = onnx.defs.OpSchema(
        OP_TYPE,
        DOMAIN,
        1,
        inputs=[param("x", "T")],
        outputs=[param("y", "T")],
        type_constraints=[("T", ["tensor(float)"], "")],
    )
    return Op(Opset(DOMAIN, 1), OP_TYPE, schema)(x)


def translation_table() -> dict[Any, Any]:
    """What ``torch.onnx.export(custom_translation_table=...)`` needs for a rank graph."""
    return {torch.ops.aotforge.all_reduce.default: all_reduce_onnx}
