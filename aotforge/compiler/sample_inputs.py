"""The inputs a build validates and benchmarks on: the user's samples, or generated ones.

``--sample-inputs FILE.npz|DIR`` (``sample_inputs=`` in Python: the same path, or a list of dicts
of arrays; ``sample_inputs`` in a recipe) are read by ``compiler.sample_files`` and checked
against the IO spec by ``compiler.sample_check``. Without them, seeded inputs are generated that
respect each input's dtype and value range (ids within the vocabulary, 0/1 masks).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.hashing import sha256_file
from aotforge.compiler.sample_check import check_samples
from aotforge.compiler.sample_files import read_samples
from aotforge.compiler.source import Arrays
from aotforge.core.errors import AotforgeError, InputSpecError, describe
from aotforge.core.spec import IOSpec, TensorSpec

#: Generated samples drawn at each range end (min, max), besides ``--validation-samples`` at opt.
EDGE_SAMPLES = 2

#: What ``sample_inputs`` may be: a path, or dicts of arrays.
SampleInputs = str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]]


def make_inputs(io: IOSpec, sizes: Mapping[str, int], *, seed: int, count: int) -> list[Arrays]:
    """``count`` input sets for the shapes in ``sizes``, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [{spec.name: _one(spec, spec.bind(sizes), rng) for spec in io.inputs} for _ in range(count)]


def validation_shapes(io: IOSpec) -> dict[str, dict[str, int]]:
    """The dim sizes generated inputs validate at: ``opt``, then ``min`` and ``max`` of every range.

    An artifact must accept every shape of its declared ranges: checking opt alone would miss a
    bucket that pads, or a range end that does not run. An end equal to one before it is left out.
    """
    shapes: dict[str, dict[str, int]] = {}
    for which in ("opt", "min", "max"):
        sizes = io.bound_sizes(which)
        if sizes not in shapes.values():
            shapes[which] = sizes
    return shapes


def generated_inputs(io: IOSpec, *, seed: int, count: int) -> list[Arrays]:
    """``count`` seeded samples at opt (first: the benchmark times it), ``EDGE_SAMPLES`` at each range end."""
    samples: list[Arrays] = []
    for i, (which, sizes) in enumerate(validation_shapes(io).items()):
        samples += make_inputs(io, sizes, seed=seed + i, count=count if which == "opt" else min(count, EDGE_SAMPLES))
    return samples


def _one(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        lo, hi = spec.value_range or _default_int_range(spec.name)
        values = rng.integers(int(lo), max(int(hi), int(lo) + 1), size=shape).astype(dtype)
        if _is_mask(spec.name) and values.ndim and values.shape[-1] and hi > 1:
            # Real masks attend to the first token ([CLS]); an all-zero row pools to a zero
            # vector, where cosine is undefined and a 1e-4 fp16 residue reads as cosine 0.
            values[..., 0] = 1
        return values
    if spec.value_range is not None:
        lo, hi = spec.value_range
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def _default_int_range(name: str) -> tuple[int, int]:
    # Unknown integer inputs: masks are 0/1, anything else gets small non-negative ids.
    return (0, 2) if _is_mask(name) else (0, 8)


def _is_mask(name: str) -> bool:
    return "mask" in name.lower()


@dataclasses.dataclass(frozen=True)
class ValidationInputs:
    """The inputs a build validates and benchmarks on, and what the source model gives for them."""

    samples: list[Arrays]
    #: The IO spec, with the dims the samples bind where no ``--dynamic`` declared them.
    io: IOSpec
    #: The named dims' sizes in the first sample (what the validation and benchmark ran at).
    sizes: dict[str, int]
    #: The manifest's record of where the inputs came from.
    record: dict[str, Any]
    #: The source model's outputs, computed once here; other inputs run the source model.
    reference: Callable[[Arrays], Arrays]


def validation_inputs(
    io: IOSpec,
    given: SampleInputs | None,
    reference: Callable[[Arrays], Arrays],
    *,
    seed: int,
    count: int,
) -> ValidationInputs:
    """The user's sample inputs (checked against ``io``), else ``count`` generated ones; the source
    model is run on each here, so a model that rejects them fails before any compile."""
    if given is None:
        sizes = io.bound_sizes("opt")
        samples = generated_inputs(io, seed=seed, count=count)
        record: dict[str, Any] = {"source": "generated", "seed": seed, "shapes": validation_shapes(io)}
    else:
        loaded, where = _given(given, io)
        samples, io = check_samples(io, loaded, where)
        sizes = {d: samples[0][s.name].shape[i] for s in io.inputs for i, d in enumerate(s.shape) if isinstance(d, str)}
        record = {"source": "sample_inputs", "path": where}
        if isinstance(given, (str, Path)) and Path(given).is_file():
            record["file_sha256"] = sha256_file(Path(given))
    record.update(count=len(samples), sha256=arrays_sha256(samples))
    outputs = {id(x): _run_reference(reference, x, i, record) for i, x in enumerate(samples)}
    return ValidationInputs(samples, io, sizes, record, lambda x: outputs.get(id(x)) or reference(x))


def _given(given: SampleInputs, io: IOSpec) -> tuple[list[Mapping[str, Any]], str]:
    if isinstance(given, (str, Path)):
        return list(read_samples(Path(given), io)), str(given)
    if isinstance(given, Mapping):  # one sample given as a dict: as if in a list of one
        return [given], "(one dict of arrays)"
    return list(given), f"({len(given)} dicts of arrays)"


def _run_reference(
    reference: Callable[[Arrays], Arrays], sample: Arrays, index: int, record: Mapping[str, Any]
) -> Arrays:
    try:
        return reference(sample)
    except AotforgeError:  # already one clear error (a reference run past its deadline)
        raise
    except Exception as e:  # the user's model, or ORT refusing the values: report, never a traceback
        if record["source"] == "generated":
            raise InputSpecError(
                f"the source model itself fails on the generated validation inputs ({describe(e)}): generated "
                "values do not fit inputs that hold indices, axes, shapes or divisors; give real inputs with "
                "--sample-inputs FILE.npz|DIR (sample_inputs= in Python, sample_inputs in a recipe)"
            ) from e
        raise InputSpecError(
            f"the source model itself fails on sample {index} of --sample-inputs {record['path']} ({describe(e)}): "
            "check that the data is a valid input of the model"
        ) from e


def arrays_sha256(samples: Sequence[Mapping[str, np.ndarray]]) -> str:
    """sha256 over the samples' names, dtypes, shapes and bytes: the same data gives the same digest."""
    digest = hashlib.sha256()
    for sample in samples:
        for name in sorted(sample):
            array = np.asarray(sample[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.dtype.name}\0{list(array.shape)}\0".encode())
            digest.update(array.tobytes() if array.dtype.kind != "O" else repr(array.tolist()).encode())
    return digest.hexdigest()
