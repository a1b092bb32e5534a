"""tools/bench_qat.py's figures: the share of the int4 gap recovered from the two builds' gate figures (against the
original fp32 model's perplexity: the trained model's gate compares with its own float weights), and a build that
failed shown as such, not as a figure."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench_qat import recovered, tables


def _built(perplexity: float, reference: float) -> dict[str, Any]:
    quality = {"perplexity": perplexity, "reference_perplexity": reference, "mean_kl": 0.1}
    return {"path": "art", "quality": quality}


def test_the_share_recovered_is_measured_against_the_original_fp32_model() -> None:
    baseline, trained = _built(15.0, 14.0), _built(14.4, 14.2)  # its gate's reference: the trained float weights
    assert recovered(baseline, trained) == pytest.approx(0.6)
    rows = tables({"baseline": baseline, "trained": trained, "qat": {}, "gap_recovered": 0.6})[0]["rows"]
    assert rows[0][:2] == ["fp32 (transformers)", 14.0]
    assert rows[2][2] == f"{14.4 / 14.0 - 1:+.1%}" and rows[2][-1] == 0.6


def test_a_build_that_failed_is_reported_not_scored() -> None:
    failed = {"error": ["OptionsError: ..."]}
    assert recovered(_built(15.0, 14.0), failed) is None
    rows = tables({"baseline": _built(15.0, 14.0), "trained": failed, "qat": {}, "gap_recovered": None})[0]["rows"]
    assert rows[-1][1].startswith("not built")
