"""The one numerics harness: compare any outputs with a reference's, per output, worst case over inputs.

Floating-point outputs (bfloat16 and float8 included) are compared by relative L2, max abs and
cosine over their finite values; NaN and +/-Inf must sit in the same places (a Sqrt of a
negative gives NaN in the reference too), and one out of place makes the output infinitely
wrong. Integer, bool and string outputs (indices, masks, token ids) must match exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aotforge.compiler.source import Arrays


@dataclasses.dataclass(frozen=True)
class OutputMetrics:
    max_abs: float
    rel_l2: float
    cosine: float
    #: Elements that differ where only an exact match counts: integer / bool / string values, NaN / Inf places.
    mismatched: int = 0


_FAILED = OutputMetrics(float("inf"), float("inf"), 0.0)
_EQUAL = OutputMetrics(0.0, 0.0, 1.0)


def compare(reference: Arrays, got: Arrays) -> dict[str, OutputMetrics]:
    """Per-output metrics; a missing or reshaped output is infinitely wrong. A sequence output
    (a list of arrays) counts its worst element."""
    return {name: _compare_value(ref, got.get(name)) for name, ref in reference.items()}


def _compare_value(ref: Any, out: Any) -> OutputMetrics:
    if ref is None:  # an empty optional
        return _EQUAL if out is None else _FAILED
    if isinstance(ref, (list, tuple)):  # a sequence output
        if not isinstance(out, (list, tuple)) or len(out) != len(ref):
            return _FAILED
        return worst([{"": _compare_value(r, o)} for r, o in zip(ref, out, strict=True)])[""] if ref else _EQUAL
    if out is None or isinstance(out, (list, tuple)) or np.shape(out) != np.shape(ref):
        return dataclasses.replace(_FAILED, mismatched=int(np.size(ref)))
    return compare_one(np.asarray(ref), np.asarray(out))


def compare_one(ref: np.ndarray, out: np.ndarray) -> OutputMetrics:
    """The metrics of one output against its reference, both of the same shape."""
    if _is_exact(ref.dtype) or _is_exact(out.dtype):
        return _exact(ref, out)
    r, o = _as_float64(ref), _as_float64(out)
    finite = np.isfinite(r) & np.isfinite(o)
    # Both NaN, or the same infinity: equal, and left out of the error figures.
    same = (np.isnan(r) & np.isnan(o)) | (np.isinf(r) & (r == o))
    misplaced = int(np.count_nonzero(~finite & ~same))
    if misplaced:
        return dataclasses.replace(_FAILED, mismatched=misplaced)
    return _distance(r[finite], o[finite])


def _distance(r: np.ndarray, o: np.ndarray) -> OutputMetrics:
    diff = o - r
    ref_norm, out_norm = float(np.linalg.norm(r)), float(np.linalg.norm(o))
    rel = float(np.linalg.norm(diff)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(diff))
    cos = float(r @ o) / (ref_norm * out_norm) if ref_norm > 0 and out_norm > 0 else float(ref_norm == out_norm)
    return OutputMetrics(float(np.max(np.abs(diff))) if diff.size else 0.0, rel, cos)


def _exact(ref: np.ndarray, out: np.ndarray) -> OutputMetrics:
    mismatched = int(np.count_nonzero(ref != out))
    if not mismatched:
        return _EQUAL
    if ref.dtype.kind in "iub" and out.dtype.kind in "iub":
        distance = _distance(ref.astype(np.float64).ravel(), out.astype(np.float64).ravel())
        return OutputMetrics(distance.max_abs, float("inf"), distance.cosine, mismatched)
    return dataclasses.replace(_FAILED, mismatched=mismatched)


def _is_exact(dtype: np.dtype) -> bool:
    # ml_dtypes' int4/uint4 are kind "V" like bfloat16: ask numpy whether they are integers.
    return dtype.kind in "iubOSU" or (dtype.kind == "V" and _ml_integer(dtype))


def _ml_integer(dtype: np.dtype) -> bool:
    try:
        import ml_dtypes

        ml_dtypes.iinfo(dtype)
        return True
    except (ImportError, ValueError, TypeError):
        return False


def _as_float64(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "c":  # real and imaginary parts as pairs of floats
        return values.astype(np.complex128).view(np.float64).ravel()
    return values.astype(np.float64).ravel()


def worst(runs: Sequence[dict[str, OutputMetrics]]) -> dict[str, OutputMetrics]:
    """The worst figure per output and metric over several input sets."""
    names = runs[0].keys()
    return {
        n: OutputMetrics(
            max(r[n].max_abs for r in runs),
            max(r[n].rel_l2 for r in runs),
            min(r[n].cosine for r in runs),
            max(r[n].mismatched for r in runs),
        )
        for n in names
    }


def compare_many(
    reference: Callable[[Arrays], Arrays], candidate: Callable[[Arrays], Arrays], inputs: Sequence[Arrays]
) -> dict[str, OutputMetrics]:
    return worst([compare(reference(x), candidate(x)) for x in inputs])
