"""The collectives of sharded graphs, as torch ops that each export to one ONNX node.

``torch.ops.aotforge.all_reduce(x)`` is the identity in torch (a rank module is only ever traced, never run
for its numbers) and exports as ``ai.onnx.contrib::AllReduce``: the domain onnxruntime-extensions runs Python
ops from, so the rank's runtime supplies the collective (``targets/onnxruntime/tensor_parallel.py``) and the
graph stays one graph per rank, not a graph cut at every all-reduce. A sequence-parallel prefill
(``tensor_parallel.SequenceSplit``) uses two more: ``reduce_scatter(x, degree)`` (the sum, each rank keeping its
``ceil(T / degree)`` positions of the sequence axis, the last rank's padded with zeros) and ``all_gather(x, tokens)``
(the ranks' slices side by side, cut back to the prompt's ``T = tokens.shape[1]`` positions).
"""

from __future__ import annotations

from typing import Any

import torch

#: The ONNX node a rank graph's all-reduce becomes (a runtime matches both).
DOMAIN, OP_TYPE = "ai.onnx.contrib", "AllReduce"
#: The sequence-parallel prefill's two (a runtime matches them by these names too).
REDUCE_SCATTER_OP, ALL_GATHER_OP = "ReduceScatter", "AllGather"
#: The nodes a pipeline stage graph hands its hidden states on with, and takes them from the stage before with.
SEND_OP, RECV_OP = "StageSend", "StageRecv"


@torch.library.custom_op("aotforge::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the ranks; traced only, so the identity here."""
    return x.clone()


@all_reduce.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("aotforge::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor, degree: int) -> torch.Tensor:
    """Rank r's positions ``r*c .. (r+1)*c`` (``c = ceil(T / degree)``) of the sum of ``x [batch, T, ...]`` over the
    ranks; traced only, so rank 0's slice of ``x`` here."""
    return sequence_slice(x, degree, 0)


@reduce_scatter.register_fake
def _(x: torch.Tensor, degree: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], (x.shape[1] + degree - 1) // degree, *x.shape[2:])


@torch.library.custom_op("aotforge::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The ranks' slices ``x [batch, c, ...]`` side by side on the sequence axis, cut to ``tokens.shape[1]``
    positions; traced only, so zeros here."""
    return x.new_zeros(x.shape[0], tokens.shape[1], *x.shape[2:])


@all_gather.register_fake
def _(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], tokens.shape[1], *x.shape[2:])


def sequence_slice(x: torch.Tensor, degree: int, rank: int) -> torch.Tensor:
    """Positions ``rank*c .. (rank+1)*c`` of ``x``'s sequence axis (1), in plain torch ops: what a rank keeps of a
    replicated tensor (GPT-2's position embeddings). Positions past the prompt (the last rank's padding) repeat
    its last one: the all-gathers drop them, and row-wise ops never mix them into real ones."""
    size = (x.shape[1] + degree - 1) // degree
    at = (torch.arange(size, device=x.device) + rank * size).clamp(max=x.shape[1] - 1)
    return x.index_select(1, at)


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
_INT64 = ("I", ["tensor(int64)"], "")


def all_reduce_onnx(x: Any) -> Any:
    """The ONNX translation: one ``AllReduce`` node of the contrib domain, float in, float out."""
    return _contrib(OP_TYPE, [("x", "T")], [_FLOAT])(x)


def reduce_scatter_onnx(x: Any, degree: int) -> Any:
    """One ``ReduceScatter`` node; the runtime knows the degree (its group's size), so it is no attribute."""
    return _contrib(REDUCE_SCATTER_OP, [("x", "T")], [_FLOAT])(x)


def all_gather_onnx(x: Any, tokens: Any) -> Any:
    return _contrib(ALL_GATHER_OP, [("x", "T"), ("tokens", "I")], [_FLOAT, _INT64])(x, tokens)


def stage_send_onnx(hidden: Any) -> Any:
    return _contrib(SEND_OP, [("hidden", "T")], [_FLOAT])(hidden)


def stage_recv_onnx(input_ids: Any, like: Any) -> Any:
    return _contrib(RECV_OP, [("input_ids", "I"), ("like", "T")], [_FLOAT, _INT64])(input_ids, like)


def translation_table() -> dict[Any, Any]:
    """What ``torch.onnx.export(custom_translation_table=...)`` needs for a rank or stage graph."""
    return {
        torch.ops.aotforge.all_reduce.default: all_reduce_onnx,
        torch.ops.aotforge.reduce_scatter.default: reduce_scatter_onnx,
        torch.ops.aotforge.all_gather.default: all_gather_onnx,
        torch.ops.aotforge.stage_send.default: stage_send_onnx,
        torch.ops.aotforge.stage_recv.default: stage_recv_onnx,
    }
