"""Transparent huge pages under the onnxruntime sessions' weights: the mechanism backs what a block allocates with
2 MiB pages, text-generation builds ask for it by default, and the built artifact's engine opens with it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.targets.huge_pages import HUGE_PAGE, huge_bytes, huge_pages, unavailable
from aotforge.targets.onnxruntime import OrtOptions

SIZE = 24 * HUGE_PAGE // 4  # float32 elements in 48 MiB


def _huge_bytes(array: np.ndarray) -> int:
    return huge_bytes(array.ctypes.data, array.ctypes.data + array.nbytes)


@pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "-")
def test_block_allocations_land_on_huge_pages() -> None:
    """An array allocated (and written) inside the block is on huge pages after it, with its values unchanged."""
    with huge_pages() as report:
        # 48 MiB: above glibc's largest dynamic mmap threshold (32 MiB on 64-bit), so it is a mapping of its own
        # whatever earlier tests in this process freed; 16 MiB could land in heap space a freed block left behind
        weights = np.arange(SIZE, dtype=np.float32)
    if any(key.startswith("MADV_COLLAPSE: errno 22") for key in report.refused) and not _huge_bytes(weights):
        pytest.skip(f"this kernel has no MADV_COLLAPSE (Linux 6.1+): {report.refused}")
    assert report.advised_bytes >= 22 * HUGE_PAGE and not report.skipped
    huge = _huge_bytes(weights)
    # A shared host's kernel may have no free 2 MiB block left for a page or two (another process just took them):
    # the block must then say so in its report, never fall short silently.
    collapse_refused = any(key.startswith("MADV_COLLAPSE") for key in report.refused)
    assert huge >= 22 * HUGE_PAGE or (huge > 0 and collapse_refused), (huge // HUGE_PAGE, report.refused)
    np.testing.assert_array_equal(weights, np.arange(SIZE, dtype=np.float32))


def test_off_unless_asked() -> None:
    """Not asked: nothing advised. Only text-generation builds ask by default (their backend's target defaults)."""
    from aotforge.compiler.generative.build import _target_options
    from aotforge.compiler.options import BuildOptions
    from aotforge.targets import get_target
    from aotforge.targets.generative import generative_backend

    with huge_pages(False) as report:
        pass
    assert (report.advised_bytes, report.skipped) == (0, "not asked")
    assert OrtOptions().huge_pages is False
    backend, target = generative_backend("onnxruntime"), get_target("onnxruntime")
    for given, expected in (({}, True), ({"huge_pages": "0"}, False)):  # from the CLI, a string: the user's wins
        opts = BuildOptions(target="onnxruntime", target_options=given)
        assert _target_options(opts, target, backend).huge_pages is expected


def test_artifact_engine_opens_on_huge_pages(llama_ort: Any) -> None:
    """The build records the setting (manifest, ``session.json``); the loaded engine advised its sessions' memory."""
    assert llama_ort.manifest.target.options["huge_pages"] is True
    assert json.loads((llama_ort.path / "session.json").read_text())["huge_pages"] is True
    report = aotforge.load(llama_ort.path)._generative().engine.huge_pages
    assert report.skipped == unavailable()
