"""How a torch module's example inputs and outputs are named, for the export and the reference alike.

Inputs are bound to ``forward``'s parameters by name (``inspect.signature``), whatever order a
dict or a transformers ``BatchEncoding`` holds them in; outputs are named after the keys of the
``ModelOutput`` / dict / tuple the model returns, as Optimum names them (``last_hidden_state``,
``pooler_output``, ``logits``; ``output_0``, ``output_1`` for a tuple; ``output`` for one tensor).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aotforge.compiler.torch_arrays import to_torch
from aotforge.core.errors import InputSpecError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclasses.dataclass(frozen=True)
class BoundInputs:
    """Example inputs bound to ``forward``'s parameters, in the signature's order.

    ``tensors`` become graph inputs; ``constants`` (bools, ints, strings) are passed to the export
    and to the reference alike, so both run the same branch of the model.
    """

    tensors: dict[str, Any]
    constants: dict[str, Any]

    def call(self, model: Any, tensors: Mapping[str, Any]) -> Any:
        return model(**tensors, **self.constants)


def bind_inputs(model: Any, example_inputs: Mapping[str, Any] | Sequence[Any]) -> BoundInputs:
    """Bind ``example_inputs`` (a mapping by name, or a sequence of positional values) to ``model.forward``."""
    import torch

    params = list(inspect.signature(model.forward).parameters.values())
    named = [p for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if isinstance(example_inputs, Mapping):
        given = dict(example_inputs)
    else:
        positional = [p.name for p in named if p.kind in _POSITIONAL]
        if len(example_inputs) > len(positional):
            raise InputSpecError(
                f"{type(model).__name__}.forward takes {len(positional)} positional inputs "
                f"({', '.join(positional)}), got {len(example_inputs)}: give example_inputs as a dict by name"
            )
        given = dict(zip(positional, example_inputs, strict=False))
    known = [p.name for p in named]
    unknown = [k for k in given if k not in known]
    if unknown and not takes_any:
        raise InputSpecError(
            f"example input(s) {', '.join(unknown)} are not parameters of {type(model).__name__}.forward "
            f"({', '.join(known)}): key the example inputs by forward's parameter names"
        )
    missing = [p.name for p in named if p.default is inspect.Parameter.empty and given.get(p.name) is None]
    if missing:
        raise InputSpecError(f"{type(model).__name__}.forward needs input(s) {', '.join(missing)}: add them")
    order = known + unknown  # **kwargs extras keep the order given
    tensors: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for name in (n for n in order if n in given and given[n] is not None):
        value = given[name]
        if isinstance(value, np.ndarray):
            value = to_torch(value)
        (tensors if isinstance(value, torch.Tensor) else constants)[name] = value
    if not tensors:
        raise InputSpecError(f"no tensor among the example inputs of {type(model).__name__}: give at least one")
    return BoundInputs(tensors, constants)


def positional_module(model: Any, bound: BoundInputs) -> Any:
    """``model`` behind a ``forward(*tensors)`` taking the bound tensors in order.

    torch.export and ONNX then see the inputs positionally, in the order the graph's inputs are
    named, and targets that trace the program (neuron) call it with tensors in IO-spec order.
    """
    import torch

    names = list(bound.tensors)

    class Bound(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            return bound.call(self.model, dict(zip(names, tensors, strict=True)))

    return Bound().eval()


def output_names(out_spec: Any, given: Sequence[str] | None) -> list[str]:
    """One name per output leaf of ``out_spec`` (a pytree spec): ``given`` ones, else from its keys."""
    import torch
    import torch.utils._pytree as pytree

    count = out_spec.num_leaves
    if given:
        if len(given) != count:
            raise InputSpecError(f"OUTPUT_NAMES gives {len(given)} names but the model returns {count} outputs")
        return list(given)
    placeholder = pytree.tree_unflatten([torch.zeros(1) for _ in range(count)], out_spec)
    return [_path_name(path) for path, _ in pytree.tree_flatten_with_path(placeholder)[0]]


def _path_name(path: Sequence[Any]) -> str:
    import torch.utils._pytree as pytree

    parts = []
    for i, key in enumerate(path):
        if isinstance(key, pytree.SequenceKey):
            parts.append(f"output_{key.idx}" if i == 0 else str(key.idx))
        elif isinstance(key, pytree.MappingKey):
            parts.append(str(key.key))
        elif isinstance(key, pytree.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key))
    return ".".join(parts) or "output"
