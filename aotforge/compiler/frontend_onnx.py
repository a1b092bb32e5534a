"""The ONNX frontend: load by path (external data and >2 GB models work), check, infer shapes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.external_data
import onnx_ir.passes.common as common

from aotforge.artifacts.hashing import sha256_file
from aotforge.compiler.isolation import Isolation
from aotforge.compiler.source import Arrays, SourceModel, numpy_dtype, spec_shape, vocab_ranges
from aotforge.core.errors import ModelLoadError, UnsupportedModelError, ValidationFailedError, describe
from aotforge.core.spec import IOSpec, TensorSpec


def load_onnx(
    path: Path,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    *,
    run_deadline_s: float = Isolation.run_deadline_s,
) -> SourceModel:
    """Load ``path`` as the IR; refuse missing, non-ONNX or truncated files with a clear message.
    Each run of the reference stops after ``run_deadline_s`` (a Loop of 2^30 iterations would not)."""
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist: check the path")
    try:
        # By path, so the checker follows external data and is not bound by protobuf's 2 GB limit.
        onnx.checker.check_model(str(path))
    except Exception as e:
        raise ModelLoadError(
            f"{path} is not a valid ONNX model ({describe(e)}): re-export it, or check the file is complete"
        ) from e
    try:
        model = ir.load(path)
    except Exception as e:  # onnx_ir's SerdeError wraps whatever it could not read (an unknown element type ...)
        root: BaseException = e
        while root.__cause__ is not None:  # the innermost cause names the problem ("99 is not a valid DataType")
            root = root.__cause__
        cause = describe(root)
        raise ModelLoadError(
            f"{path} has a part onnx_ir cannot read ({cause}): re-export it with standard ONNX types and ops"
        ) from e
    if _external_bytes(model) < 2**31:
        # Weights in memory: the passes' checker would otherwise resolve the data file against the cwd.
        model = onnx_ir.external_data.load_to_model(model)
    # Old exporters list weights as graph inputs; as inputs they could be overridden, which
    # stops folding and would make them required once folding removes their initializer.
    model = common.RemoveInitializersFromInputsPass()(model).model
    model.ir_version = max(model.ir_version, 4)  # IR < 4 requires initializers to be inputs
    model = common.ShapeInferencePass()(model).model
    io = _io_spec(model, ranges or {})
    reference = _ort_reference(path, run_deadline_s)
    return SourceModel(ir=model, io=io, name=path.stem, format="onnx", sha256=sha256_file(path), reference=reference)


def _external_bytes(model: ir.Model) -> int:
    """Bytes of the initializers stored in external data files."""
    external = [v.const_value for v in model.graph.initializers.values()]
    return sum(t.nbytes for t in external if isinstance(t, ir.ExternalTensor))


def _io_spec(model: ir.Model, ranges: Mapping[str, tuple[float, float]]) -> IOSpec:
    found = vocab_ranges(model)
    inputs = []
    for value in model.graph.inputs:
        name = str(value.name)
        dtype = numpy_dtype(value.dtype) if value.dtype is not None else "float32"
        shape = _name_unknown_dims(name, spec_shape(value.shape))
        inputs.append(TensorSpec(name, dtype, shape, ranges.get(name, found.get(name))))
    outputs = [
        TensorSpec(str(v.name), numpy_dtype(v.dtype) if v.dtype is not None else "float32", spec_shape(v.shape))
        for v in model.graph.outputs
    ]
    return IOSpec(tuple(inputs), tuple(outputs))


def _name_unknown_dims(name: str, shape: tuple[int | str, ...]) -> tuple[int | str, ...]:
    # Dims with no name get one, so --dynamic can bind them and the manifest can show them.
    return tuple(f"{name}_dim{i}" if d == "unk" else d for i, d in enumerate(shape))


def _ort_reference(path: Path, deadline_s: float) -> Callable[[Arrays], Arrays]:
    from aotforge.targets.onnxruntime import reference_session
    from aotforge.targets.onnxruntime.session_io import run_with_deadline

    try:
        session = reference_session(str(path))
    except Exception as e:  # ORT raises untyped errors for ops it does not implement
        raise UnsupportedModelError(
            f"onnxruntime, the reference for ONNX sources, cannot run {path.name} ({describe(e)}): "
            "replace the unsupported op or export the model with standard ONNX ops"
        ) from e
    names = [o.name for o in session.get_outputs()]

    def run(inputs: Arrays) -> Arrays:
        try:
            return run_with_deadline(session, names, inputs, deadline_s)
        except TimeoutError:
            raise ValidationFailedError(
                f"the source model {path.name} did not finish one run on a validation input within {deadline_s:g} s "
                "(onnxruntime, the reference): a Loop or Scan with a huge trip count, or a model too slow for this "
                "host; raise --run-deadline if it only needs longer, or give smaller --sample-inputs"
            ) from None

    return run
