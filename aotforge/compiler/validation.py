"""Validation of a compiled artifact against the source model: the plan recorded, the check, the message."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from aotforge.compiler.numerics import OutputMetrics, compare_many
from aotforge.compiler.source import Arrays
from aotforge.core.errors import ValidationFailedError

#: Below this cosine an output no longer resembles the source's: a tolerance is not the fix.
BROKEN_COSINE = 0.9


def validation_plan(
    source_format: str,
    tolerance: float,
    samples: Sequence[Arrays],
    seed: int,
    bound_dims: Mapping[str, int],
    inputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What the manifest records of how the artifact is validated, before any metric exists;
    ``inputs`` says where the samples came from (generated, or the user's, with their sha256)."""
    return {
        "reference": "torch eager" if source_format == "torch" else "onnxruntime on the unmodified ONNX",
        "metric": "rel_l2",
        "tolerance": tolerance,
        "samples": len(samples),
        "seed": seed,
        "bound_dims": dict(bound_dims),
        **({"inputs": dict(inputs)} if inputs else {}),
    }


def validate(
    reference: Callable[[Arrays], Arrays],
    run: Callable[[Arrays], Arrays],
    samples: Sequence[Arrays],
    plan: Mapping[str, Any],
    *,
    model: str,
    target: str,
) -> dict[str, Any]:
    """Compare ``run`` with ``reference`` on ``samples``; the manifest's validation record, or a failure."""
    dtypes: dict[str, np.dtype] = {}

    def recorded(sample: Arrays) -> Arrays:
        outputs = reference(sample)
        for name, value in outputs.items():
            if value is not None and not isinstance(value, (list, tuple)):
                dtypes.setdefault(name, np.asarray(value).dtype)
        return outputs

    metrics = compare_many(recorded, run, list(samples))
    tolerance = float(plan["tolerance"])
    floors = {n: f for n, f in ((n, resolution(d)) for n, d in dtypes.items()) if f > tolerance}
    if not all(m.rel_l2 <= floors.get(n, tolerance) for n, m in metrics.items()):
        message = failure_message(model, target, metrics, tolerance, floors)
        raise ValidationFailedError(message + _source_nonfinite(reference, samples))
    record = {**plan, "metrics": {n: dataclasses.asdict(m) for n, m in metrics.items()}, "passed": True}
    if floors:  # outputs whose own type rounds coarser than the tolerance: held to that instead
        record["tolerance_by_output_dtype"] = {n: float(f) for n, f in sorted(floors.items())}
    return record


def resolution(dtype: np.dtype) -> float:
    """A floating dtype's epsilon (float16: 2**-10): a rel L2 tolerance finer than it only counts rounding."""
    if dtype.kind == "f":
        return float(np.finfo(dtype).eps)
    if dtype.kind == "V" and dtype.type.__module__.split(".")[0] == "ml_dtypes":  # bfloat16, float8
        import ml_dtypes

        try:
            return float(ml_dtypes.finfo(dtype).eps)
        except (ValueError, TypeError):  # int4 and the like: compared exactly
            return 0.0
    return 0.0


def failure_message(
    model: str,
    target: str,
    metrics: Mapping[str, OutputMetrics],
    tolerance: float,
    floors: Mapping[str, float] | None = None,
) -> str:
    floors = floors or {}
    bad = {n: m for n, m in metrics.items() if not m.rel_l2 <= floors.get(n, tolerance)}
    shown = "; ".join(
        f"{n}: rel L2 {m.rel_l2:.3g}, max abs {m.max_abs:.3g}, cosine {m.cosine:.6f}"
        + (f", {m.mismatched} element(s) differ where only an exact match counts" if m.mismatched else "")
        + (f" (a {floors[n]:.3g} tolerance: its dtype's epsilon)" if n in floors else "")
        for n, m in bad.items()
    )
    head = f"{model} on {target} does not match the source model ({shown}; tolerance rel L2 {tolerance:g})"
    if any(m.mismatched for m in bad.values()):
        # Integer / bool values or NaN / Inf places that differ: no tolerance covers them.
        return (
            f"{head}: integer, bool and string outputs and the places of NaN / Inf must match the source "
            "exactly; drop the pass that changes numerics, or report the target bug"
        )
    if any(not m.cosine >= BROKEN_COSINE for m in bad.values()):
        # A cosine this low is a broken model, not a precision loss: never invite a looser tolerance.
        return (
            f"{head}: an output's cosine is under {BROKEN_COSINE}, so a pass or the target breaks the model; "
            "drop the pass that changes numerics (or give int8 / int8-dynamic an --accuracy-budget and --calibration), "
            "or report the target bug"
        )
    return f"{head}: drop the pass that changes numerics, or raise --tolerance if this error is acceptable"


def _source_nonfinite(reference: Callable[[Arrays], Arrays], samples: Sequence[Arrays]) -> str:
    """A note when the source model itself outputs NaN / Inf on the validation inputs (its own
    behaviour, not the target's: the target may legitimately differ there, e.g. under fast math)."""
    names: dict[str, int] = {}
    for sample in samples:
        for name, value in reference(sample).items():
            array = np.asarray(value)
            if array.dtype.kind in "fc":
                names[name] = names.get(name, 0) + int(np.count_nonzero(~np.isfinite(array)))
    found = {n: c for n, c in names.items() if c}
    if not found:
        return ""
    listed = ", ".join(f"{n} ({c} element(s))" for n, c in found.items())
    return (
        f". Note: the source model itself outputs NaN / Inf on the validation inputs ({listed}), where targets "
        "compiled with fast math (tvm) may give other values: give inputs in the model's domain with --sample-inputs"
    )
