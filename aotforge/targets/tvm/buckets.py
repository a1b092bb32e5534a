"""Shape buckets: how a static-shape tvm build accepts every shape of the declared ranges.

The CPU schedules need static shapes (the Relax importer cannot even import a BERT export with a
symbolic sequence), so the target compiles one Relax function per *bucket* (a size for each
named dim) into one ``lib.so`` and routes each call at run time. Each dim is served one way:

- ``split`` — a batch dim that is axis 0 of every input and output: the rows of an inference
  graph are independent, so a batch runs as chunks of a bucket size (the last chunk padded by
  repeating its last row) and the outputs are concatenated. Default bucket: the dim's ``opt``.
- ``pad`` — a sequence dim that an attention-mask input covers: inputs are zero-padded at the end
  (mask 0: padded tokens are attended by no real token) up to the smallest bucket that holds them,
  and outputs carrying the dim are cut back. Default buckets: ``opt`` and ``max``.
- ``exact`` — any other dim: every size of its range is a bucket (at most ``MAX_EXACT_SIZES``).

A size outside the declared range gets one ``InputSpecError`` naming the range. Validation runs at
the min, opt and max of every range, so padded and split routes are checked against the source.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aotforge.core.errors import InputSpecError, OptionsError
from aotforge.core.spec import DimRange, IOSpec, parse_dim_sizes

SPLIT, PAD, EXACT = "split", "pad", "exact"
#: A dim that can be neither split nor padded has a bucket per size: more than this is refused.
MAX_EXACT_SIZES = 4
#: The function the opt bucket compiles to (the only one of a single-bucket build, as before buckets).
OPT_FUNCTION = "main"

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class DimPlan:
    """How one named dim is served: ``split``, ``pad`` or ``exact``, over bucket ``sizes``."""

    name: str
    how: str
    sizes: tuple[int, ...]
    min: int
    max: int


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One compiled static shape: a size per named dim, and the Relax function that runs it."""

    sizes: tuple[tuple[str, int], ...]
    function: str

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    dims: tuple[DimPlan, ...]
    buckets: tuple[Bucket, ...]

    def to_info(self) -> dict[str, Any]:
        """The manifest's record: per dim how it runs, and every compiled bucket."""
        return {
            "dims": [dataclasses.asdict(d) for d in self.dims],
            "buckets": [{"sizes": dict(b.sizes), "function": b.function} for b in self.buckets],
        }

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> BucketPlan:
        dims = tuple(DimPlan(d["name"], d["how"], tuple(d["sizes"]), d["min"], d["max"]) for d in info["dims"])
        buckets = tuple(
            Bucket(tuple((k, int(v)) for k, v in b["sizes"].items()), b["function"]) for b in info["buckets"]
        )
        return cls(dims, buckets)


def plan_buckets(io: IOSpec, declared: Sequence[str] = (), max_buckets: int = 8) -> BucketPlan:
    """The buckets to compile for ``io``'s declared ranges; ``declared`` are ``dim=a/b/c`` overrides."""
    sizes = parse_dim_sizes(declared, io, "tvm")
    dims = tuple(_plan_dim(io, io.dim(name) or _undeclared(name), sizes.get(name)) for name in io.symbolic_dims())
    opt = {d.name: d.opt for d in io.dims}
    combos = list(itertools.product(*[[(d.name, s) for s in d.sizes] for d in dims]))
    if len(combos) > max_buckets:
        raise OptionsError(
            f"tvm would compile {len(combos)} shape buckets ({_describe(dims)}), more than max_buckets={max_buckets}: "
            "declare fewer sizes (--target-opt buckets=seq=32/128), narrow --dynamic, or raise max_buckets"
        )
    # The opt bucket first (validation and the benchmark run it), then smallest to largest.
    combos.sort(key=lambda c: (any(s != opt[n] for n, s in c), int(np.prod([s for _, s in c]))))
    buckets = tuple(Bucket(tuple(c), OPT_FUNCTION if i == 0 else _function(c)) for i, c in enumerate(combos))
    return BucketPlan(dims, buckets)


def _plan_dim(io: IOSpec, rng: DimRange, declared: tuple[int, ...] | None) -> DimPlan:
    how = SPLIT if _splittable(io, rng) else PAD if _paddable(io, rng) else EXACT
    if how == EXACT:
        sizes = tuple(range(rng.min, rng.max + 1))
        if declared is not None and set(declared) != set(sizes) or len(sizes) > MAX_EXACT_SIZES:
            raise InputSpecError(
                f"tvm compiles static shapes, and dim {rng.name!r} (range {rng.min}..{rng.max}) can be neither "
                "split (a batch at axis 0 of every input and output) nor padded (a sequence an attention-mask "
                f"input covers): every size needs its own bucket, at most {MAX_EXACT_SIZES}; declare fewer sizes, "
                f"e.g. --dynamic {rng.name}={rng.opt}, or use --target onnxruntime, which keeps dims symbolic"
            )
        return DimPlan(rng.name, how, sizes, rng.min, rng.max)
    if declared is None:
        declared = (rng.opt,) if how == SPLIT else tuple(sorted({rng.opt, rng.max}))
    if declared[0] < rng.min or declared[-1] > rng.max or (how == PAD and declared[-1] != rng.max):
        raise OptionsError(
            f"tvm buckets for dim {rng.name!r} are {list(declared)} but its range is {rng.min}..{rng.max}: sizes "
            f"must lie in the range{' and the largest must be the max' if how == PAD else ''}"
        )
    return DimPlan(rng.name, how, declared, rng.min, rng.max)


def _splittable(io: IOSpec, rng: DimRange) -> bool:
    if rng.kind != "batch":
        return False
    specs = [*io.inputs, *io.outputs]
    return all(s.shape[:1] == (rng.name,) and rng.name not in s.shape[1:] for s in specs)


def _paddable(io: IOSpec, rng: DimRange) -> bool:
    masks = [s for s in io.inputs if "mask" in s.name.lower() and rng.name in s.shape]
    return rng.kind == "sequence" and bool(masks)


def _undeclared(name: str) -> DimRange:
    raise InputSpecError(f"tvm: dim {name!r} has no declared range: declare it, e.g. --dynamic {name}=1:8:32")


def _function(combo: Sequence[tuple[str, int]]) -> str:
    return "main_" + "_".join(f"{n}{s}" for n, s in combo)


def _describe(dims: Sequence[DimPlan]) -> str:
    return ", ".join(f"{d.name}: {d.how} {'/'.join(map(str, d.sizes))}" for d in dims)


def describe_plan(plan: BucketPlan) -> str:
    """One line for the model card: which shapes run and how."""
    return _describe(plan.dims)
