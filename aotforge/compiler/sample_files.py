"""Reading a user's sample inputs (``--sample-inputs``) from disk.

Accepted, for a model whose inputs are ``spec``:

- ``FILE.npz``: arrays named after the inputs; one sample, or several when every array carries
  an extra leading samples axis.
- ``DIR`` of ``.npz`` files (each as above) or, for a one-input model, ``.npy`` files.
- ``DIR`` holding ``input_0.pb`` ... (an ONNX test-data set, serialized ``TensorProto``s, as
  ``onnx.backend.test`` and the ONNX model zoo ship them), or of ``test_data_set_*`` such
  directories, one sample each. A tensor is matched to an input by its name, else by position.

bfloat16 / float8 arrays come back as ``ml_dtypes`` arrays (``np.savez`` stores them as raw
``V2`` / ``V1`` records; those are viewed as the input's dtype).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.compiler.source import Arrays
from aotforge.core.errors import InputSpecError
from aotforge.core.spec import IOSpec

_PB_INPUT = re.compile(r"^input_(\d+)\.pb$")


def read_samples(path: Path, io: IOSpec) -> list[Arrays]:
    """Every sample under ``path``, in a stable order; one clear error for a path we cannot read."""
    if path.is_file():
        if path.suffix != ".npz":
            raise InputSpecError(f"sample inputs {path} is not a .npz file: give FILE.npz or a directory of samples")
        return _split(_npz(path, io), io)
    if not path.is_dir():
        raise InputSpecError(f"sample inputs {path} does not exist: give FILE.npz or a directory of samples")
    data_sets = sorted((d for d in path.iterdir() if d.is_dir() and d.name.startswith("test_data_set_")), key=_natural)
    if any(_PB_INPUT.match(f.name) or re.match(r"^output_\d+\.pb$", f.name) for f in path.iterdir()):
        data_sets = [path]
    if data_sets:
        return [_pb_set(d, io) for d in data_sets]
    files = sorted((f for f in path.iterdir() if f.suffix in (".npz", ".npy")), key=_natural)
    if not files:
        raise InputSpecError(
            f"no samples in {path}: put .npz files (arrays named after the inputs) or input_0.pb ... there"
        )
    samples: list[Arrays] = []
    for file in files:
        samples.extend(_split(_npz(file, io) if file.suffix == ".npz" else _npy(file, io), io))
    return samples


def _natural(path: Path) -> tuple[int, str]:
    digits = re.findall(r"\d+", path.name)
    return (int(digits[-1]) if digits else -1, path.name)


#: How each file kind starts: numpy reads anything else as a pickle, and says "pickled data".
_MAGIC = {".npz": (b"PK\x03\x04", b"PK\x05\x06"), ".npy": (b"\x93NUMPY",)}


def _load(path: Path) -> Any:
    """``np.load`` without pickles, every failure one :class:`InputSpecError` saying what the file is not."""
    kind = path.suffix.lower()
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise InputSpecError(f"cannot read sample inputs {path}: {e}") from e
    if not head.startswith(_MAGIC[kind]):
        raise InputSpecError(
            f"sample inputs {path} is not a {kind} file (its first bytes are not numpy's {kind} header): "
            f"write it with numpy.{'savez' if kind == '.npz' else 'save'}"
        )
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputSpecError(
            f"sample inputs {path} is a damaged or incomplete {kind} file ({e}): write it again"
        ) from e


def _npz(path: Path, io: IOSpec) -> Arrays:
    try:
        with _load(path) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise InputSpecError(f"sample inputs {path} is a damaged or incomplete .npz file ({e}): write it again") from e
    except ValueError as e:
        raise InputSpecError(
            f"sample inputs {path} holds an array aotforge does not load ({e}): save plain numeric arrays, "
            "not Python objects"
        ) from e
    return {name: _typed(array, io, name) for name, array in arrays.items()}


def _npy(path: Path, io: IOSpec) -> Arrays:
    if len(io.inputs) != 1:
        names = ", ".join(s.name for s in io.inputs)
        raise InputSpecError(
            f"sample file {path} is a .npy, but the model has inputs {names}: use .npz files naming each input"
        )
    array = _load(path)
    name = io.inputs[0].name
    return {name: _typed(array, io, name)}


def _typed(array: np.ndarray, io: IOSpec, name: str) -> np.ndarray:
    """A raw ``V<n>`` record array (how .npy stores ml_dtypes values) viewed as the input's dtype."""
    spec = next((s for s in io.inputs if s.name == name), None)
    if spec is None or array.dtype.kind != "V" or array.dtype.names is not None:
        return array
    want = np.dtype(spec.dtype)
    return array.view(want) if want.itemsize == array.dtype.itemsize else array


def _pb_set(directory: Path, io: IOSpec) -> Arrays:
    import onnx
    from onnx import numpy_helper

    names = [s.name for s in io.inputs]
    files = sorted((f for f in directory.iterdir() if _PB_INPUT.match(f.name)), key=_natural)
    if not files and io.inputs:
        raise InputSpecError(f"ONNX test-data set {directory} holds no input_<i>.pb files")
    sample: Arrays = {}
    for file in files:
        tensor = onnx.TensorProto()
        try:
            tensor.ParseFromString(file.read_bytes())
            array = numpy_helper.to_array(tensor)
        except Exception as e:  # protobuf's DecodeError, or a sequence/map proto in a tensor's place
            raise InputSpecError(
                f"{file} is not a serialized ONNX TensorProto ({type(e).__name__}: {e}); "
                "only tensor inputs can be given as samples"
            ) from e
        index = int(_natural(file)[0])
        name = tensor.name if tensor.name in names else (names[index] if index < len(names) else tensor.name)
        sample[name or f"input_{index}"] = array
    return sample


def _split(arrays: Arrays, io: IOSpec) -> list[Arrays]:
    """One sample, or one per row when every array has one more dim than its input."""
    ranks = {s.name: len(s.shape) for s in io.inputs}
    if arrays and all(n in ranks and a.ndim == ranks[n] + 1 for n, a in arrays.items()):
        counts = {len(a) for a in arrays.values()}
        if len(counts) != 1:
            raise InputSpecError(
                f"stacked sample inputs have different sample counts {sorted(counts)}: give every input as many rows"
            )
        return [{n: a[i] for n, a in arrays.items()} for i in range(counts.pop())]
    return [arrays]
