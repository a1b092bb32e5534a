"""What a frontend hands to the rest of the build: the IR, its IO spec and a reference to check against."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from aotforge.core.errors import UnsupportedModelError
from aotforge.core.spec import IOSpec

if TYPE_CHECKING:  # onnx_ir costs ~0.8 s to import; compiler.benchmark imports Arrays from here
    import onnx_ir as ir

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass
class SourceModel:
    """A loaded model. ``reference`` runs the *unmodified* source (torch eager or ORT on the original file)."""

    ir: ir.Model
    io: IOSpec
    name: str
    format: str
    sha256: str
    reference: Callable[[Arrays], Arrays]
    example_inputs: Arrays | None = None
    torch_program: Any = None
    #: Files copied into the artifact as they are (artifact-relative path -> source file), e.g. a tokenizer.
    files: Mapping[str, Path] = dataclasses.field(default_factory=dict)
    #: More about the source for the manifest's ``source`` record (a transformers task, its architecture).
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def numpy_dtype(dtype: ir.DataType) -> str:
    try:
        return str(np.dtype(dtype.numpy()))
    except TypeError as e:  # UNDEFINED and types numpy has no equivalent for
        raise UnsupportedModelError(
            f"a model input or output has element type {dtype.name}, which has no array type ({e}): "
            "re-export the model with a concrete element type"
        ) from e


def spec_shape(shape: ir.Shape | None) -> tuple[int | str, ...]:
    """An IR shape as spec dims: ints stay, symbolic dims keep their name."""
    if shape is None:
        return ()
    return tuple(d if isinstance(d, int) else str(d.value or "unk") for d in shape)


def vocab_ranges(model: ir.Model) -> dict[str, tuple[float, float]]:
    """Integer graph inputs that index a Gather table: valid ids are ``[0, rows)``."""
    inputs = {v.name: v for v in model.graph.inputs}
    ranges: dict[str, tuple[float, float]] = {}
    for node in model.graph.all_nodes():
        if node.op_type != "Gather" or len(node.inputs) < 2:
            continue
        table, indices = node.inputs[0], node.inputs[1]
        if indices is None or table is None or indices.name not in inputs:
            continue
        if table.const_value is not None and table.shape is not None and isinstance(table.shape[0], int):
            axis = node.attributes.get_int("axis", 0)
            if axis == 0:
                ranges[str(indices.name)] = (0.0, float(table.shape[0]))
    return ranges
