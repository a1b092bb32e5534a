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

from aotforge.core.errors import InputSpecError, OptionsError

Dim = int | str

_DIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class DimRange:
    """A named dynamic dim: the smallest, the typical (``opt``) and the largest size.

    ``kind`` (``batch``, ``sequence`` or empty) is what ``core.dim_defaults`` found the dim to be;
    targets that pad or split inputs read it.
    """

    name: str
    min: int
    opt: int
    max: int
    kind: str = ""

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
        return cls(name.strip(), values[0], values[1], values[2])


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
        """The concrete shape with every named dim replaced by its size in ``sizes`` (never a guessed 1)."""
        missing = [d for d in self.dynamic_dims if d not in sizes]
        if missing:
            raise InputSpecError(
                f"input {self.name!r} has dims {', '.join(missing)} with no size: "
                f"declare them, e.g. --dynamic {missing[0]}=1:8:32"
            )
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)

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
        """The size each named dim takes at ``which`` (``min``, ``opt`` or ``max``) of its declared range."""
        missing = [n for n in self.symbolic_dims() if self.dim(n) is None]
        if missing:
            raise InputSpecError(
                f"the model's dims {', '.join(missing)} have no declared range: declare them, e.g. "
                f"--dynamic {missing[0]}=1:8:32 (min:opt:max)"
            )
        return {n: int(getattr(self.dim(n), which)) for n in self.symbolic_dims()}

    def accepted(self) -> str:
        """What an artifact of this spec takes, for error messages: each input's shape and each range."""
        shapes = ", ".join(f"{s.name} {list(s.shape)}" for s in self.inputs)
        return f"inputs {shapes} with {self.ranges_text()}"

    def sizes_of(self, shapes: Mapping[str, tuple[int, ...]], who: str = "the artifact") -> dict[str, int]:
        """The size each named dim takes in ``shapes`` (input name -> shape), or one error saying what fits.

        Refuses a missing input, a wrong rank, a fixed dim of the wrong size, inputs that disagree on
        a dim, and a size outside the dim's declared range.
        """
        missing = [s.name for s in self.inputs if s.name not in shapes]
        if missing:
            raise InputSpecError(f"{who} needs input(s) {', '.join(missing)}; it takes {self.accepted()}")
        sizes: dict[str, int] = {}
        for spec in self.inputs:
            shape = tuple(shapes[spec.name])
            ok = len(shape) == len(spec.shape)
            for dim, got in zip(spec.shape, shape, strict=False):
                want = sizes.setdefault(dim, int(got)) if isinstance(dim, str) else dim
                ok = ok and got == want
            if not ok:
                raise InputSpecError(
                    f"{who} got input {spec.name!r} of shape {shape}, which does not fit: it takes {self.accepted()}"
                )
        for rng in self.dims:
            size = sizes.get(rng.name)
            if size is not None and not rng.min <= size <= rng.max:
                raise InputSpecError(
                    f"{who} got {rng.name}={size}, outside its declared range {rng.min}..{rng.max}: it takes "
                    f"{self.accepted()}; rebuild with --dynamic {rng.name}=<min>:<opt>:<max> to cover {size}"
                )
        return sizes

    def ranges_text(self) -> str:
        """The declared ranges as a user reads them: ``batch 1..8 (opt 1), seq 1..512 (opt 128)``."""
        return ", ".join(f"{d.name} {d.min}..{d.max} (opt {d.opt})" for d in self.dims) or "fixed shapes only"

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


def parse_dim_sizes(texts: Iterable[str], io: IOSpec, target: str) -> dict[str, tuple[int, ...]]:
    """``--target-opt buckets=seq=32/64/128`` (tvm, neuron): each named dim of ``io`` -> its sorted sizes."""
    out: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        try:
            sizes = tuple(sorted({int(v) for v in values.split("/")})) if sep else ()
        except ValueError:
            sizes = ()
        if not sizes or name not in io.symbolic_dims():
            raise OptionsError(
                f"{target} bucket {text!r} must read dim=size/size/..., e.g. seq=32/64/128, for a dim of the model "
                f"({', '.join(io.symbolic_dims()) or 'it has none'})"
            )
        out[name] = sizes
    return out
