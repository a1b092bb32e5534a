"""Build cache: hits skip the compile, misses say why, corrupt entries are rebuilt, never served."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from aotforge.artifacts import build_cache
from aotforge.artifacts.manifest import MANIFEST
from tests.conftest import EXAMPLES, quick_build

MODEL = str(EXAMPLES / "mini_resnet.py")
#: The cache of the module's first build and that build's manifest.
First = tuple[Path, dict[str, Any]]


def _build(out: Path, cache: Path, **kw: Any) -> dict[str, Any]:
    result = quick_build(MODEL, out, target="onnxruntime", cache_dir=cache, **kw)
    data: dict[str, Any] = json.loads((result.path / MANIFEST).read_text())
    return data


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> First:
    """The first build into an empty cache, once for the module: ``(cache, manifest)``. Each test starts from a copy
    of that cache (``_cache``), which its own builds change."""
    tmp = tmp_path_factory.mktemp("first")
    return tmp / "cache", _build(tmp / "a", tmp / "cache")


def _cache(first: First, tmp_path: Path) -> Path:
    return Path(shutil.copytree(first[0], tmp_path / "cache"))


def _entry_files(cache: Path) -> list[Path]:
    return [p for p in cache.glob("??/*/*") if p.name != build_cache.ENTRY_JSON]


def test_second_build_hits_with_identical_files(first: First, tmp_path: Path) -> None:
    cache, (_, first_build) = _cache(first, tmp_path), first
    second = _build(tmp_path / "b", cache)
    assert first_build["build"]["cache"]["hit"] is False
    assert first_build["build"]["cache"]["explain"].endswith("is empty")
    # The rebuild is a direct hit (tests/test_build_cache_direct.py), served from the same entry.
    assert second["build"]["cache"]["hit"] is True
    assert second["build"]["cache"]["key"] == first_build["build"]["cache"]["key"]
    assert second["files"] == first_build["files"]
    strip = {k: v for k, v in first_build.items() if k != "build"}
    assert {k: v for k, v in second.items() if k != "build"} == strip


def test_pass_list_change_misses_and_is_explained(first: First, tmp_path: Path) -> None:
    other = _build(tmp_path / "b", _cache(first, tmp_path), passes=("O0",))
    assert other["build"]["cache"]["hit"] is False
    assert other["build"]["cache"]["key"] != first[1]["build"]["cache"]["key"]
    assert "passes" in other["build"]["cache"]["explain"]
    assert "target" not in other["build"]["cache"]["explain"]


def test_target_option_change_misses_and_is_explained(first: First, tmp_path: Path) -> None:
    other = _build(tmp_path / "b", _cache(first, tmp_path), target_options={"optimization_level": "basic"})
    assert other["build"]["cache"]["hit"] is False
    explain = other["build"]["cache"]["explain"]
    assert explain.endswith("differs in target"), explain


def test_corrupt_entry_is_rebuilt_not_served(first: First, tmp_path: Path) -> None:
    cache, (_, first_build) = _cache(first, tmp_path), first
    files = _entry_files(cache)
    assert files
    with files[0].open("r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0xFF]))
    second = _build(tmp_path / "b", cache)
    assert second["build"]["cache"]["hit"] is False
    assert second["files"] == first_build["files"]
    third = _build(tmp_path / "c", cache)
    assert third["build"]["cache"]["hit"] is True
    assert third["files"] == first_build["files"]


def test_unreadable_entry_json_is_a_miss(first: First, tmp_path: Path) -> None:
    cache = _cache(first, tmp_path)
    (entry_json,) = cache.glob(f"??/*/{build_cache.ENTRY_JSON}")
    entry_json.write_text("{not json")
    again = _build(tmp_path / "b", cache)
    assert again["build"]["cache"]["hit"] is False
    assert _build(tmp_path / "c", cache)["build"]["cache"]["hit"] is True


def test_store_race_keeps_the_first_entry(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "f.bin").write_bytes(b"one")
    comps = {c: c * 8 for c in build_cache.COMPONENTS}
    key = build_cache.cache_key(comps)
    build_cache.store(tmp_path / "c", key, comps, stage, ["f.bin"], {}, {})
    (stage / "f.bin").write_bytes(b"two")
    build_cache.store(tmp_path / "c", key, comps, stage, ["f.bin"], {}, {})
    out = tmp_path / "out"
    out.mkdir()
    hit = build_cache.lookup(tmp_path / "c", key, out)
    assert hit is not None and (out / "f.bin").read_bytes() == b"one"
    assert not [p for p in (tmp_path / "c").rglob("*") if p.name.startswith(".tmp-")]
