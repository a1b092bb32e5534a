"""The collectives of sharded graphs, as torch ops that each export to one ONNX node.

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
#: The nodes a pipeline stage graph hands its hidden states on with, and takes them from the stage before with.
SEND_OP, RECV_OP = "StageSend", "StageRecv"


@torch.library.custom_op("aotforge::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the ranks; traced only, so the identity here."""
    return x.clone()


@all_reduce.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("aotforge::stage_send", mutates_args=())
def stage_send(hidden: torch.Tensor) -> torch.Tensor:
    """Hand ``hidden`` to the next pipeline stage, and pass it on unchanged; traced only, so the identity here."""
    return hidden.clone()


@stage_send.register_fake
def _(hidden: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(hidden)


@torch.library.custom_op("aotforge::stage_recv", mutates_args=())
def stage_recv(input_ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The hidden states ``[*input_ids.shape, len(like)]`` the stage before handed on; traced only, zeros here."""
    return like.new_zeros(*input_ids.shape, like.shape[-1])


@stage_recv.register_fake
def _(input_ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(*input_ids.shape, like.shape[-1])


def _contrib(op_type: str, inputs: list[tuple[str, str]], types: list[tuple[str, list[str], str]]) -> Any:
    import onnx
    from onnxscript.values import Op, Opset

    param = onnx.defs.OpSchema.FormalParameter
    schema = onnx.defs.OpSchema(
        op_type,
        DOMAIN,
        1,
        inputs=[param(name, kind) for name, kind in inputs],
        outputs=[param("y", "T")],
        type_constraints=types,
    )
    return Op(Opset(DOMAIN, 1), op_type, schema)


_FLOAT = ("T", ["tensor(float)"], "")


def all_reduce_onnx(x: Any) -> Any:
    """The ONNX translation: one ``AllReduce`` node of the contrib domain, float in, float out."""
    return _contrib(OP_TYPE, [("x", "T")], [_FLOAT])(x)


def stage_send_onnx(hidden: Any) -> Any:
    return _contrib(SEND_OP, [("hidden", "T")], [_FLOAT])(hidden)


def stage_recv_onnx(input_ids: Any, like: Any) -> Any:
    return _contrib(RECV_OP, [("input_ids", "I"), ("like", "T")], [_FLOAT, ("I", ["tensor(int64)"], "")])(
        input_ids, like
    )


def translation_table() -> dict[Any, Any]:
    """What ``torch.onnx.export(custom_translation_table=...)`` needs for a rank or stage graph."""
    return {
        torch.ops.aotforge.all_reduce.default: all_reduce_onnx,
        torch.ops.aotforge.stage_send.default: stage_send_onnx,
        torch.ops.aotforge.stage_recv.default: stage_recv_onnx,
    }
