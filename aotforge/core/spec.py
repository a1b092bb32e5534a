"""How a model's inputs and outputs are described: names, dtypes, shapes, dynamic dims.

A shape entry is either a fixed ``int`` or the *name* of a dynamic dim (``"batch"``). Named
dims are declared once, with a range, as :class:`DimRange`; every target reads the same
declaration (TensorRT profiles, Neuron buckets, the shapes validation and benchmarks bind).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aotforge.core.errors import InputSpecError

Dim = int | str

#: A symbolic dim that no ``--dynamic`` declaration names is bound to this size.
DEFAULT_DIM_SIZE = 1

_DIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class DimRange:
    """A named dynamic dim: the smallest, the typical (``opt``) and the largest size."""

    name: str
    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not _DIM_NAME.match(self.name):
            raise InputSpecError(f"dynamic dim name {self.name!r} is not an identifier: use e.g. batch=1:32")
        if not 1 <= self.min <= self.opt <= self.max:
            raise InputSpecError(
                f"dynamic dim {self.name!r} needs 1 <= min <= opt <= max, got "
                f"min={self.min} opt={self.opt} max={self.max}: reorder the values"
            )

    @classmethod
    def parse(cls, text: str) -> DimRange:
        """Parse ``name=min:max`` or ``name=min:opt:max`` (``opt`` defaults to ``min``)."""
        name, sep, rng = text.partition("=")
        parts = rng.split(":") if sep else []
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) not in (1, 2, 3):
            raise InputSpecError(
                f"cannot read dynamic dim {text!r}: write name=min:max or name=min:opt:max, e.g. batch=1:32"
            )
        if len(values) == 1:
            values = values * 3
        elif len(values) == 2:
            values = [values[0], values[0], values[1]]
        return cls(name.strip(), *values)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One graph input or output. ``value_range`` bounds generated integer inputs, ``[lo, hi)``."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    value_range: tuple[float, float] | None = None

    @property
    def dynamic_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))

    def bind(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The concrete shape with every named dim replaced by its size in ``sizes``."""
        return tuple(sizes.get(d, DEFAULT_DIM_SIZE) if isinstance(d, str) else d for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.value_range is not None:
            out["value_range"] = list(self.value_range)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        rng = data.get("value_range")
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=tuple(data["shape"]),
            value_range=(float(rng[0]), float(rng[1])) if rng is not None else None,
        )


@dataclasses.dataclass(frozen=True)
class IOSpec:
    """All inputs and outputs of a model plus the declared ranges of its named dims."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dims: tuple[DimRange, ...] = ()

    def dim(self, name: str) -> DimRange | None:
        return next((d for d in self.dims if d.name == name), None)

    def symbolic_dims(self) -> tuple[str, ...]:
        """Every named dim used by an input, in first-seen order."""
        seen: dict[str, None] = {}
        for spec in self.inputs:
            seen.update(dict.fromkeys(spec.dynamic_dims))
        return tuple(seen)

    def bound_sizes(self, which: str = "opt") -> dict[str, int]:
        """The size each named dim takes for validation and benchmarks (``opt`` by default)."""
        sizes = {}
        for name in self.symbolic_dims():
            rng = self.dim(name)
            sizes[name] = getattr(rng, which) if rng else DEFAULT_DIM_SIZE
        return sizes

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "dims": [dataclasses.asdict(d) for d in self.dims],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IOSpec:
        return cls(
            inputs=tuple(TensorSpec.from_dict(s) for s in data["inputs"]),
            outputs=tuple(TensorSpec.from_dict(s) for s in data["outputs"]),
            dims=tuple(DimRange(**d) for d in data.get("dims", ())),
        )


def check_dims_used(dims: Iterable[DimRange], spec: IOSpec) -> None:
    """Refuse a ``--dynamic`` declaration that names no dim of the model."""
    known = spec.symbolic_dims()
    for rng in dims:
        if rng.name not in known:
            hint = ", ".join(known) if known else "none: every input dim is fixed"
            raise InputSpecError(
                f"--dynamic names dim {rng.name!r}, which no model input has; its named dims are: {hint}"
            )


def parse_value_range(text: str) -> tuple[str, tuple[float, float]]:
    """Parse ``--input-range name=lo:hi`` (half-open ``[lo, hi)`` for integer inputs)."""
    name, sep, rng = text.partition("=")
    lo, colon, hi = rng.partition(":")
    try:
        if not (sep and colon):
            raise ValueError
        return name.strip(), (float(lo), float(hi))
    except ValueError:
        raise InputSpecError(f"cannot read input range {text!r}: write name=lo:hi, e.g. input_ids=0:30522") from None
