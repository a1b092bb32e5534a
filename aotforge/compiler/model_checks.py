"""Refusals of a model's declared inputs and outputs before anything is generated or compiled.

A declared dim of 2^40 used to end in numpy's MemoryError while drawing validation inputs, a
negative one in "negative dimensions are not allowed", a zero one (when every output is then
empty) in a build that "passed" its validation over 0 elements, and a graph with no outputs in an
ORT message about requested outputs.
Each is one message naming the input and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from aotforge.compiler.source import Arrays
from aotforge.core.errors import InputSpecError, UnsupportedModelError
from aotforge.core.spec import IOSpec

#: The largest single input a build draws validation samples for (bytes).
MAX_INPUT_BYTES = 4 << 30


def check_io(io: IOSpec, sizes: Mapping[str, int], model: str) -> None:
    """Refuse a graph without outputs and inputs whose bound shape is negative or too large."""
    if not io.outputs:
        raise UnsupportedModelError(f"{model} has no graph outputs: there is nothing to compile; re-export it")
    for spec in io.inputs:
        shape = spec.bind(sizes)
        if any(d < 0 for d in shape):
            raise InputSpecError(
                f"input {spec.name!r} of {model} declares a negative dim {list(shape)}: fix the model's input "
                "shape, or name the dim and bind it with --dynamic NAME=MIN:OPT:MAX"
            )
        size = int(np.prod([float(d) for d in shape])) * _itemsize(spec.dtype)
        if size > MAX_INPUT_BYTES:
            raise InputSpecError(
                f"input {spec.name!r} of {model} has shape {list(shape)} ({size / 2**30:.3g} GiB), over the "
                f"{MAX_INPUT_BYTES >> 30} GiB a build validates with: fix the model's input shape, or bind its "
                "dims smaller with --dynamic NAME=MIN:OPT:MAX"
            )


def _itemsize(dtype: str) -> int:
    try:
        return max(np.dtype(dtype).itemsize, 1)
    except TypeError:  # a dtype numpy does not know (bfloat16 without ml_dtypes): count it wide
        return 8


def check_compares_something(samples: Sequence[Arrays], reference: Callable[[Arrays], Arrays], model: str) -> None:
    """Refuse generated validation inputs on which every output of the source model is empty.

    An empty input alone is fine (CastLike's ``like``, a Reduce's empty ``axes``, a zero-size
    split); a build whose outputs are all empty would pass its validation over 0 elements."""
    for sample in samples:
        if any(_elements(v) for v in reference(sample).values()):
            return
    empty = [(n, list(np.shape(a))) for n, a in samples[0].items() if np.size(a) == 0] if samples else []
    if empty:
        name, shape = empty[0]
        raise InputSpecError(
            f"input {name!r} of {model} has a zero-size dim {shape}: validation would compare 0 elements; fix the "
            "model's input shape, bind the dim with --dynamic NAME=MIN:OPT:MAX (MIN >= 1), or give --sample-inputs"
        )
    raise InputSpecError(
        f"every output of {model} is empty on the validation inputs: validation would compare 0 elements; "
        "give inputs that produce output with --sample-inputs"
    )


def _elements(value: Any) -> int:
    if isinstance(value, (list, tuple)):  # a sequence output
        return len(value)
    return 0 if value is None else int(np.size(value))
