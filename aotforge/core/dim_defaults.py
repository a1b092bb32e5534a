"""Every symbolic dim gets a declared range: ``--dynamic``, else a documented default, else a refusal.

Nothing is ever silently bound to 1. The defaults, by what a dim is called:

======================  ==========================================================  ===============
kind                    names (case-insensitive; what HF, Optimum and dynamo call them)  range min:opt:max
======================  ==========================================================  ===============
``batch``               batch, batch_size, batchsize, bs, b, n, num_images, ...      1:1:8
``sequence``            seq, seq_len, sequence_length, sentence_length, tokens, ...  1:128:512
======================  ==========================================================  ===============

For a torch model the example inputs' size of the dim is its ``opt`` (and the range widens to hold
it); a dim of a torch model that is neither kind runs at the example's size only. A dim the exporter
named itself (dynamo's ``s0``, ``s72``, an unnamed ``unk__3`` or aotforge's ``<input>_dim<i>``) takes
its kind from where it sits: axis 0 is the batch, axis 1 of a rank-2 integer input (token ids, a
mask) the sequence. Any other dim of an ONNX model has no sensible default: the build refuses and
names the dims to declare with ``--dynamic``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from aotforge.core.errors import InputSpecError
from aotforge.core.spec import DimRange, IOSpec, TensorSpec

BATCH = "batch"
SEQUENCE = "sequence"

BATCH_NAMES = frozenset({"batch", "batch_size", "batchsize", "bs", "b", "n", "num_images", "batch_dim", "nbatch"})
SEQUENCE_NAMES = frozenset(
    {
        "seq",
        "seq_len",
        "seqlen",
        "seq_length",
        "sequence",
        "sequence_len",
        "sequence_length",
        "sentence_length",
        "encoder_sequence_length",
        "decoder_sequence_length",
        "num_tokens",
        "tokens",
        "token",
        "length",
        "max_seq_len",
        "text_length",
        "src_len",
        "tgt_len",
    }
)

#: The default range of each kind: (min, opt, max).
DEFAULT_RANGES: Mapping[str, tuple[int, int, int]] = {BATCH: (1, 1, 8), SEQUENCE: (1, 128, 512)}

# Names an exporter makes up: dynamo's s<N>, ONNX shape inference's unk__<N>, our <input>_dim<i>.
_AUTO_NAME = re.compile(r"^(s\d+|unk__\d+|.+_dim\d+|dynamic_axes_\d+)$")


def dim_kind(name: str, positions: Iterable[tuple[TensorSpec, int]] = ()) -> str:
    """``batch``, ``sequence`` or ``""`` for a dim called ``name`` found at ``positions``."""
    low = name.lower()
    if low in BATCH_NAMES:
        return BATCH
    if low in SEQUENCE_NAMES:
        return SEQUENCE
    if not _AUTO_NAME.match(name):
        return ""
    for spec, axis in positions:  # the first input that has the dim decides
        if axis == 0:
            return BATCH
        if axis == 1 and len(spec.shape) == 2 and "int" in spec.dtype:
            return SEQUENCE
        return ""
    return ""


def resolve_dims(
    io: IOSpec, declared: Iterable[DimRange], example_shapes: Mapping[str, tuple[int, ...]] | None = None
) -> IOSpec:
    """``io`` with a range for every symbolic input dim, each tagged with its kind.

    ``declared`` (``--dynamic``) wins; then the defaults above, with a torch model's example sizes
    (``example_shapes``) as ``opt``. Refuses, naming them, the dims that have neither.
    """
    given = {d.name: d for d in declared}
    positions = _positions(io)
    resolved, missing = [], []
    for name in io.symbolic_dims():
        kind = dim_kind(name, positions[name])
        rng = given.get(name) or _default(name, kind, _example_size(name, positions[name], example_shapes))
        if rng is None:
            missing.append(name)
        else:
            resolved.append(dataclasses.replace(rng, kind=kind))
    if missing:
        raise InputSpecError(
            f"the model's input dims {', '.join(missing)} are symbolic and have no default range "
            f"(defaults exist for batch-like and sequence-like names only): declare each, e.g. "
            f"--dynamic {missing[0]}=1:16:64 (min:opt:max), or --dynamic {missing[0]}=224 for one size"
        )
    return dataclasses.replace(io, dims=tuple(resolved))


def _default(name: str, kind: str, example: int | None) -> DimRange | None:
    if kind in DEFAULT_RANGES:
        lo, opt, hi = DEFAULT_RANGES[kind]
        if example is not None:
            opt, lo, hi = example, min(lo, example), max(hi, example)
        return DimRange(name, lo, opt, hi)
    if example is not None:  # a torch dim of no known kind: the example's size, and only it
        return DimRange(name, example, example, example)
    return None


def _positions(io: IOSpec) -> dict[str, list[tuple[TensorSpec, int]]]:
    found: dict[str, list[tuple[TensorSpec, int]]] = {}
    for spec in io.inputs:
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, str):
                found.setdefault(dim, []).append((spec, axis))
    return found


def _example_size(
    name: str, positions: list[tuple[TensorSpec, int]], shapes: Mapping[str, tuple[int, ...]] | None
) -> int | None:
    for spec, axis in positions:
        shape = (shapes or {}).get(spec.name)
        if shape is not None and axis < len(shape):
            return int(shape[axis])
    return None


def default_range(name: str, example: int) -> DimRange | None:
    """The default range of a torch dim called ``name`` whose example size is ``example``; None if no kind."""
    kind = dim_kind(name)
    return _default(name, kind, example) if kind else None
