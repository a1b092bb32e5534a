"""The numerics harness: NaN / Inf placement, exact integer / bool / string outputs, low-precision floats."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from aotforge.compiler.numerics import compare

NAN, INF = np.nan, np.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_nan_and_inf_in_the_same_places_are_equal(dtype: type) -> None:
    ref = np.array([1.0, NAN, 2.0, -INF if dtype != ml_dtypes.float8_e4m3fn else NAN], dtype)
    (m,) = compare({"y": ref}, {"y": ref.copy()}).values()
    assert (m.rel_l2, m.max_abs, m.mismatched) == (0.0, 0.0, 0)


@pytest.mark.parametrize(
    ("got", "mismatched"),
    [([1.0, 2.0, NAN], 2), ([1.0, NAN, INF], 1), ([1.0, NAN, 5.0], 1), ([NAN, NAN, -INF], 1)],
)
def test_nan_or_inf_in_other_places_fail(got: list[float], mismatched: int) -> None:
    ref = np.array([1.0, NAN, -INF], np.float32)
    (m,) = compare({"y": ref}, {"y": np.array(got, np.float32)}).values()
    assert m.rel_l2 == float("inf") and m.mismatched == mismatched


def test_finite_values_beside_nan_are_still_measured() -> None:
    ref = np.array([1.0, NAN, 3.0], np.float32)
    (m,) = compare({"y": ref}, {"y": np.array([1.0, NAN, 3.3], np.float32)}).values()
    assert m.mismatched == 0 and m.max_abs == pytest.approx(0.3, rel=1e-5) and 0 < m.rel_l2 < 0.1


@pytest.mark.parametrize(
    ("ref", "got"),
    [
        (np.array([3, 1, 2], np.int64), np.array([3, 1, 3], np.int64)),
        (np.array([True, False]), np.array([True, True])),
        (np.array(["a", "b"], dtype=object), np.array(["a", "c"], dtype=object)),
        (np.array([1000000, 5], np.int64), np.array([1000001, 5], np.int64)),  # rel L2 1e-6 would pass a tolerance
    ],
)
def test_integer_bool_and_string_outputs_compare_exactly(ref: np.ndarray, got: np.ndarray) -> None:
    (same,) = compare({"y": ref}, {"y": ref.copy()}).values()
    assert same.rel_l2 == 0.0 and same.mismatched == 0
    (m,) = compare({"y": ref}, {"y": got}).values()
    assert m.rel_l2 == float("inf") and m.mismatched == 1


def test_shape_and_rank_must_match() -> None:
    (m,) = compare({"y": np.float32(2.0)}, {"y": np.array([2.0], np.float32)}).values()  # 0-d vs 1-d
    assert m.rel_l2 == float("inf")


def test_sequence_outputs_count_their_worst_element() -> None:
    ref = [np.ones(2, np.float32), np.array([1.0, NAN], np.float32)]
    (same,) = compare({"y": ref}, {"y": [a.copy() for a in ref]}).values()
    assert same.rel_l2 == 0.0
    (m,) = compare({"y": ref}, {"y": [ref[0], np.ones(2, np.float32)]}).values()
    assert m.rel_l2 == float("inf")
    (short,) = compare({"y": ref}, {"y": ref[:1]}).values()
    assert short.rel_l2 == float("inf")


def test_a_float16_output_is_held_to_its_own_epsilon_not_a_finer_tolerance() -> None:
    """One-ulp float16 differences (rel L2 ~5e-4) pass a 1e-4 tolerance; float32 ones of that size do not."""
    from aotforge.compiler.validation import validate, validation_plan

    ref = np.linspace(1, 2, 64).astype(np.float16)
    off = (ref + np.float16(2**-10)).astype(np.float16)  # one ulp of [1, 2) on every element
    plan = validation_plan("onnx", 1e-4, [{}], 0, {})
    record = validate(lambda _: {"y": ref}, lambda _: {"y": off}, [{}], plan, model="m", target="t")
    assert record["tolerance_by_output_dtype"] == {"y": 2**-10}
    with pytest.raises(Exception, match="tolerance rel L2 0.0001"):
        validate(
            lambda _: {"y": ref.astype(np.float32)},
            lambda _: {"y": off.astype(np.float32)},
            [{}],
            plan,
            model="m",
            target="t",
        )
