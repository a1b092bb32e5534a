"""The tvm text-generation artifact's one weight file (``targets/tvm/decoder/weight_file``), without a build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aotforge.core.errors import CompileError
from aotforge.targets.huge_pages import HUGE_PAGE, HugePageReport, huge_bytes, unavailable
from aotforge.targets.tvm.decoder.graphs import WeightRef
from aotforge.targets.tvm.decoder.weight_file import TVM_WEIGHTS_FILE, read_weights, write_weights


def _export(tmp_path: Path, arrays: dict[str, np.ndarray]) -> list[WeightRef]:
    """``arrays`` in a ``weights.data`` as the export lays it out (named by offset there; by key here)."""
    refs, offset = [], 0
    with (tmp_path / "weights.data").open("wb") as f:
        for name, a in arrays.items():
            f.write(a.tobytes())
            refs.append(WeightRef(name, offset, a.nbytes, str(a.dtype), a.shape))
            offset += a.nbytes
    return refs


def test_only_what_the_functions_take_is_stored_equal_bytes_once(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    embedding, dropped = rng.standard_normal((50, 8)).astype(np.float32), np.ones((8, 8), np.float32)
    exported = _export(tmp_path, {"w0": embedding, "w1600": dropped})
    head = rng.standard_normal((8, 64)).astype(np.float32)
    packed = {"w0.t.p32": head, "w9.p32": head.copy(), "w7.int4g32.q": rng.integers(0, 255, (4, 16), np.uint8)}
    stored = write_weights(tmp_path, exported[:1], packed)
    assert not (tmp_path / "weights.data").exists(), "the export's file is replaced, not kept beside"
    assert [r.name for r in stored] == ["w0", "w0.t.p32", "w9.p32", "w7.int4g32.q"]
    assert {r.file for r in stored} == {TVM_WEIGHTS_FILE}
    assert all(r.offset % 4096 == 0 for r in stored)
    assert stored[1].offset == stored[2].offset, "equal bytes are stored once"
    size = (tmp_path / TVM_WEIGHTS_FILE).stat().st_size
    assert size == 2 * 4096 + 64  # the embedding (1600 bytes), the head (2048) once, the int4 bytes
    loaded = read_weights(tmp_path, stored)
    np.testing.assert_array_equal(loaded["w0"].numpy(), embedding)
    np.testing.assert_array_equal(loaded["w9.p32"].numpy(), head)
    np.testing.assert_array_equal(loaded["w7.int4g32.q"].numpy(), packed["w7.int4g32.q"])
    assert loaded["w0.t.p32"] is loaded["w9.p32"], "refs to the same bytes share one tensor at run time"


def test_a_short_or_foreign_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / TVM_WEIGHTS_FILE).write_bytes(b"\0" * 16)
    with pytest.raises(CompileError, match="ends before tensor w0"):
        read_weights(tmp_path, [WeightRef("w0", 0, 64, "float32", (16,), TVM_WEIGHTS_FILE)])
    with pytest.raises(CompileError, match="weight file 'model.bin'"):
        read_weights(tmp_path, [WeightRef("w0", 0, 16, "float32", (4,), "model.bin")])


def test_an_artifact_built_before_its_own_weight_file_still_loads(tmp_path: Path) -> None:
    """Refs written before ``TVM_WEIGHTS_FILE`` have no ``file``: they point into the ``weights.data`` kept then."""
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    (ref,) = _export(tmp_path, {"w0": table})
    old = {k: v for k, v in ref.to_dict().items() if k != "file"}
    loaded = read_weights(tmp_path, [WeightRef.from_dict(old)])
    np.testing.assert_array_equal(loaded["w0"].numpy(), table)


@pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "-")
def test_the_weights_are_read_into_one_region_on_huge_pages(tmp_path: Path) -> None:
    """Every tensor is a view of one 2 MiB-aligned region the kernel backs with huge pages; values unchanged."""
    rng = np.random.default_rng(1)
    packed = {f"w{i}.p48": rng.standard_normal((1024, 1024 + i)).astype(np.float32) for i in range(3)}  # ~12 MiB
    (tmp_path / "weights.data").write_bytes(b"")
    stored = write_weights(tmp_path, [], packed)
    report = HugePageReport()
    loaded = read_weights(tmp_path, stored, huge_pages=True, report=report)
    views = {name: np.from_dlpack(t) for name, t in loaded.items()}
    for name, array in packed.items():
        np.testing.assert_array_equal(views[name], array)
    low = min(v.ctypes.data for v in views.values())
    high = max(v.ctypes.data + v.nbytes for v in views.values())
    assert low % HUGE_PAGE == 0 and high - low == (tmp_path / TVM_WEIGHTS_FILE).stat().st_size
    if report.refused and not huge_bytes(low, high):
        pytest.skip(f"the kernel granted no huge pages here: {report.refused}")
    assert huge_bytes(low, high) >= 4 * HUGE_PAGE
    off = HugePageReport()
    read_weights(tmp_path, stored, huge_pages=False, report=off)
    assert off.skipped == "not asked" and not off.advised_bytes
