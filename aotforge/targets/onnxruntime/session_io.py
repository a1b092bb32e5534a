"""Running an ONNX Runtime session on arrays numpy has no dtype of its own for.

bfloat16, the float8 family and the 4-bit types come as ``ml_dtypes`` arrays (what
``onnx.numpy_helper.to_array`` returns). ORT's ``session.run`` refuses them (``Numpy_type 256
can't be converted``) and ``OrtValue.numpy()`` cannot return them, so such inputs are fed as
OrtValues of the right ONNX element type and such outputs are read back through the bytes of
their OrtValue. ONNX's own tensor (de)serialization does the (un)packing of 4-bit values.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

Arrays = dict[str, np.ndarray]

#: ORT's type string ("tensor(bfloat16)") -> the ONNX element type.
_ELEMENT_TYPES = {f"tensor({name.lower()})": value for name, value in onnx.TensorProto.DataType.items()}


def is_exotic(dtype: np.dtype) -> bool:
    """A dtype ``ml_dtypes`` adds (bfloat16, float8, int4, ...): ORT cannot take it as a numpy array."""
    return dtype.type.__module__.split(".")[0] == "ml_dtypes"


def run_session(session: Any, output_names: Sequence[str], inputs: Arrays, run_options: Any = None) -> Arrays:
    """``session.run`` that also feeds and returns ``ml_dtypes`` arrays (bfloat16, float8, int4)."""
    types = {o.name: o.type for o in session.get_outputs()}
    exotic_out = [n for n in output_names if _exotic_type(types.get(n, ""))]
    exotic_in = [n for n, v in inputs.items() if is_exotic(np.asarray(v).dtype)]
    if not exotic_in and not exotic_out:
        return _named(output_names, session.run(list(output_names), inputs, run_options))
    import onnxruntime as ort

    # session.run takes OrtValues beside numpy arrays; only run_with_ort_values returns OrtValues.
    feeds = {n: _ort_value(ort, np.asarray(v)) if n in exotic_in else v for n, v in inputs.items()}
    if not exotic_out:
        return _named(output_names, session.run(list(output_names), feeds, run_options))
    feeds = {
        n: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(np.require(v, requirements="C"))
        for n, v in feeds.items()
    }
    results = session.run_with_ort_values(list(output_names), feeds, run_options)
    return {n: _read(v) for n, v in zip(output_names, results, strict=True)}


def _named(names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
    # Sequence outputs come back as lists of arrays, empty optionals as None: left as they are.
    return {n: v if isinstance(v, list) or v is None else np.asarray(v) for n, v in zip(names, values, strict=True)}


def _exotic_type(ort_type: str) -> bool:
    element = _ELEMENT_TYPES.get(ort_type)
    if element is None:  # sequences, maps, optionals: not tensors of one element type
        return False
    try:
        return is_exotic(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(element)))
    except (KeyError, TypeError, ValueError):
        return False


def _ort_value(ort: Any, array: np.ndarray) -> Any:
    """An OrtValue holding ``array``'s values in ONNX's layout for its element type (4-bit packed)."""
    proto = numpy_helper.from_array(array)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), proto.data_type)
    raw = proto.raw_data
    if len(raw) != value.tensor_size_in_bytes():
        raise ValueError(
            f"{array.dtype} array of shape {array.shape} serialized to {len(raw)} bytes, ORT holds "
            f"{value.tensor_size_in_bytes()}"
        )
    if raw:
        ctypes.memmove(value.data_ptr(), raw, len(raw))
    return value


def _read(value: Any) -> np.ndarray:
    if not value.is_tensor():
        return np.asarray(value.numpy())
    element = _ELEMENT_TYPES.get(value.data_type())
    if element is None or not _exotic_type(value.data_type()):
        return np.asarray(value.numpy())
    size = value.tensor_size_in_bytes()
    raw = ctypes.string_at(value.data_ptr(), size) if size else b""
    proto = onnx.helper.make_tensor("out", element, list(value.shape()), raw, raw=True)
    return numpy_helper.to_array(proto)


def run_with_deadline(session: Any, output_names: Sequence[str], inputs: Arrays, deadline_s: float) -> Arrays:
    """:func:`run_session`, stopped after ``deadline_s``: ORT checks ``RunOptions.terminate`` between
    nodes and between a Loop's iterations, so a run that would take hours ends in :class:`TimeoutError`."""
    import threading

    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # the stopped run's own ERROR line would be a second message
    timer = threading.Timer(deadline_s, lambda: setattr(options, "terminate", True))
    timer.daemon = True
    timer.start()
    try:
        return run_session(session, output_names, inputs, options)
    except Exception as e:
        if options.terminate:
            raise TimeoutError(f"stopped after {deadline_s:g} s") from e
        raise
    finally:
        timer.cancel()
