"""The PyTorch frontend: a model file -> torch.export -> ONNX (dynamo exporter) -> IR.

A model file (``examples/mini_resnet.py``) or module (``pkg.mod``) defines:

- ``get_model()`` -> ``torch.nn.Module``
- ``get_example_inputs()`` -> ``dict[str, torch.Tensor]``, keyed by ``forward``'s argument names
- optionally ``DYNAMIC_DIMS = {"x": {0: "batch"}}`` naming dims that ``--dynamic`` may bind,
  ``OUTPUT_NAMES = [...]`` and ``INPUT_RANGES = {"input_ids": (0, 30522)}``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir
import onnx_ir.passes.common as common

from aotforge.compiler.source import Arrays, SourceModel, numpy_dtype, spec_shape, vocab_ranges
from aotforge.compiler.torch_arrays import to_numpy, to_torch
from aotforge.compiler.torch_binding import BoundInputs, bind_inputs, positional_module
from aotforge.compiler.torch_binding import output_names as torch_output_names
from aotforge.compiler.torch_onnx_registry import share_torchlib_registry
from aotforge.core.dim_defaults import default_range
from aotforge.core.errors import InputSpecError, ModelLoadError, UnsupportedModelError, describe
from aotforge.core.spec import DimRange, IOSpec, TensorSpec

#: Dynamic dims no ``--dynamic`` bounds are exported with this range.
DEFAULT_DYNAMIC_MAX = 64


def load_torch_file(ref: str, dims: tuple[DimRange, ...], ranges: Mapping[str, tuple[float, float]]) -> SourceModel:
    """Import a model file or module and export it."""
    module = _import(ref)
    for attr in ("get_model", "get_example_inputs"):
        if not callable(getattr(module, attr, None)):
            raise ModelLoadError(
                f"{ref} defines no {attr}(): a torch model file must define get_model() and get_example_inputs()"
            )
    model = module.get_model()
    inputs = dict(module.get_example_inputs())
    return load_torch_module(
        model,
        inputs,
        name=Path(ref.split(":")[0]).stem.split(".")[-1],
        dims=dims,
        dynamic_axes=getattr(module, "DYNAMIC_DIMS", {}),
        output_names=list(getattr(module, "OUTPUT_NAMES", [])),
        ranges={**getattr(module, "INPUT_RANGES", {}), **ranges},
        source_bytes=Path(module.__file__ or "").read_bytes() if module.__file__ else b"",
    )


def load_torch_module(
    model: Any,
    example_inputs: Mapping[str, Any] | Sequence[Any],
    *,
    name: str,
    dims: tuple[DimRange, ...] = (),
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    output_names: list[str] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    source_bytes: bytes = b"",
) -> SourceModel:
    """Export an ``nn.Module`` with example inputs (bound to ``forward`` by name) into the IR."""
    import torch

    model = model.eval()
    bound = bind_inputs(model, example_inputs)
    tensors = bound.tensors
    declared = {d.name: d for d in dims}
    axes = {k: dict(v) for k, v in (dynamic_axes or {}).items()}
    _check_axes(axes, tensors)
    shapes = {
        arg: {
            axis: _export_dim(declared, dim, int(tensors[arg].shape[axis])) for axis, dim in axes.get(arg, {}).items()
        }
        or None
        for arg in tensors
    }
    args = tuple(tensors.values())
    # forward(*tensors): torch.export takes the shapes of a *args parameter under its name.
    dynamic_shapes = {"tensors": tuple(shapes.values())} if axes else None
    share_torchlib_registry()
    try:
        with torch.no_grad():
            program = torch.export.export(positional_module(model, bound), args, dynamic_shapes=dynamic_shapes)
            onnx_program = torch.onnx.export(program, args, dynamo=True, verbose=False, input_names=list(tensors))
    except Exception as e:
        raise UnsupportedModelError(f"torch.export / ONNX export of {name} failed: {describe(e)}") from e
    if onnx_program is None:
        raise UnsupportedModelError(f"torch.onnx.export of {name} returned no program")
    ir_model = onnx_program.model
    _rename_symbols(ir_model, axes)
    _name_outputs(ir_model, torch_output_names(program.call_spec.out_spec, output_names), name)
    io = _io_spec(ir_model, tensors, ranges or {})
    return SourceModel(
        ir=ir_model,
        io=io,
        name=name,
        format="torch",
        sha256=_torch_sha256(model, source_bytes),
        reference=_eager_reference(model, bound, [o.name for o in io.outputs]),
        example_inputs={k: to_numpy(v) for k, v in tensors.items()},
        torch_program=program,
    )


def _export_dim(declared: Mapping[str, DimRange], dim: str, example: int) -> Any:
    """The export range: ``--dynamic``'s, else the kind's default (``core.dim_defaults``), else 1..64.

    The last only widens the graph; the artifact's declared range for such a dim is the example size.
    """
    import torch

    rng = declared.get(dim) or default_range(dim, example) or DimRange(dim, 1, 1, max(DEFAULT_DYNAMIC_MAX, example))
    if rng.min == rng.max:  # torch.export refuses min == max; the declared range still pins the size
        return torch.export.Dim(dim, min=1, max=max(DEFAULT_DYNAMIC_MAX, rng.max))
    return torch.export.Dim(dim, min=rng.min, max=rng.max)


def _check_axes(axes: Mapping[str, Mapping[int, str]], example_inputs: Mapping[str, Any]) -> None:
    for arg, ax in axes.items():
        if arg not in example_inputs:
            raise InputSpecError(f"DYNAMIC_DIMS names input {arg!r}, not one of {', '.join(example_inputs)}")
        rank = example_inputs[arg].dim()
        bad = [a for a in ax if not 0 <= a < rank]
        if bad:
            raise InputSpecError(f"DYNAMIC_DIMS gives axis {bad[0]} for input {arg!r}, which has rank {rank}")


def _rename_symbols(model: ir.Model, axes: Mapping[str, Mapping[int, str]]) -> None:
    """torch names symbolic dims ``s0, s72 ...``: give them the user's names across the graph."""
    mapping: dict[str, str] = {}
    for value in model.graph.inputs:
        for axis, dim in axes.get(str(value.name), {}).items():
            sym = value.shape[axis] if value.shape is not None else 0
            if isinstance(sym, ir.SymbolicDim):
                mapping[str(sym.value)] = dim
    if not mapping:
        return
    values = list(model.graph.inputs) + list(model.graph.outputs)
    values += [out for node in model.graph.all_nodes() for out in node.outputs]
    for value in values:
        if value.shape is None:
            continue
        dims = [mapping.get(str(d.value), d.value) if not isinstance(d, int) else d for d in value.shape]
        value.shape = ir.Shape(dims)


def _io_spec(model: ir.Model, example_inputs: Mapping[str, Any], ranges: Mapping[str, tuple[float, float]]) -> IOSpec:
    found = vocab_ranges(model)
    inputs = []
    for value in model.graph.inputs:
        name = str(value.name)
        rng = ranges.get(name) or found.get(name) or _example_range(example_inputs.get(name))
        inputs.append(TensorSpec(name, numpy_dtype(value.dtype or ir.DataType.FLOAT), spec_shape(value.shape), rng))
    outputs = [
        TensorSpec(str(v.name), numpy_dtype(v.dtype or ir.DataType.FLOAT), spec_shape(v.shape))
        for v in model.graph.outputs
    ]
    return IOSpec(tuple(inputs), tuple(outputs))


def _example_range(tensor: Any) -> tuple[float, float] | None:
    if tensor is None or tensor.is_floating_point():
        return None
    return float(tensor.min()), float(tensor.max()) + 1.0


def _name_outputs(model: ir.Model, names: list[str], model_name: str) -> None:
    """Give the graph outputs the model's own names.

    An output that is also an input, a constant or an earlier output gets its own Identity, so
    each name is one value. The exporter may have used a wanted name for an internal value (e.g.
    "embedding" for a BERT Gather); NameFixPass keeps the outputs' names and renames that one.
    """
    graph = model.graph
    if len(names) != len(graph.outputs):
        raise UnsupportedModelError(
            f"{model_name} returns {len(names)} tensors but its ONNX export has {len(graph.outputs)} outputs: "
            "return only tensors (a ModelOutput, dict, tuple or one tensor)"
        )
    claimed: set[int] = set()
    for i, name in enumerate(names):
        value = graph.outputs[i]
        if id(value) in claimed or value.is_graph_input() or value.producer() is None:
            copy = ir.Value(type=value.type, shape=value.shape)
            graph.append(ir.node("Identity", [value], outputs=[copy]))
            value = graph.outputs[i] = copy
        claimed.add(id(value))
        value.name = name
    common.NameFixPass()(model)


def _eager_reference(model: Any, bound: BoundInputs, output_names: list[str]) -> Any:
    import torch
    import torch.utils._pytree as pytree

    def run(inputs: Arrays) -> Arrays:
        tensors = {n: to_torch(inputs[n]) for n in bound.tensors}
        with torch.no_grad():
            out = bound.call(model, tensors)
        leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        return {n: to_numpy(t) for n, t in zip(output_names, leaves, strict=True)}

    return run


def _torch_sha256(model: Any, source_bytes: bytes) -> str:
    digest = hashlib.sha256(source_bytes)
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _import(ref: str) -> types.ModuleType:
    path = Path(ref)
    if path.suffix == ".py":
        if not path.is_file():
            raise ModelLoadError(f"model file {path} does not exist: check the path")
        spec = importlib.util.spec_from_file_location(f"aotforge_model_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ModelLoadError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ModelLoadError(f"importing {path} failed: {type(e).__name__}: {describe(e)}") from e
        return module
    try:
        return importlib.import_module(ref)
    except ImportError as e:
        raise ModelLoadError(
            f"cannot import model module {ref!r} ({e}): give a .py file, a .onnx file or an importable module"
        ) from e
