"""Every byte of an artifact is covered: its files by the manifest, the manifest by its own sha256.

Before: editing the io dtype or target name of an unsigned manifest passed ``verify`` (2 of 360 single
byte flips did too, one then crashed ``load``); a file replaced by a symlink to a copy outside passed
``verify`` and ``load``.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import aotforge
from aotforge.artifacts.local_registry import LocalRegistry
from aotforge.compiler.cli import main
from aotforge.core.errors import ArtifactError
from tests.tiny_models import relu_add


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An artifact compiled through the CLI, and the manifest sha256 the CLI printed."""
    tmp = tmp_path_factory.mktemp("every_byte")
    model = relu_add(tmp / "m.onnx")
    result = CliRunner().invoke(
        main, ["compile", str(model), "--target", "onnxruntime", "--out", str(tmp / "out"), "--no-bench"]
    )
    assert result.exit_code == 0, result.output
    match = re.search(r"manifest sha256: ([0-9a-f]{64})", result.output)
    assert match, result.output
    return Path(result.output.strip().splitlines()[-1]), match[1]


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _edit(path: Path, change: dict[str, object]) -> None:
    data = json.loads((path / "manifest.json").read_text())
    for key, value in change.items():
        node = data
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    (path / "manifest.json").write_text(json.dumps(data, sort_keys=True, indent=2) + "\n")


def test_the_printed_digest_verifies(built: tuple[Path, str]) -> None:
    path, digest = built
    result = CliRunner().invoke(main, ["verify", str(path), "--manifest-sha256", digest])
    assert result.exit_code == 0 and "manifest sha256 ok" in result.output, result.output
    assert aotforge.load(path, manifest_sha256=digest).manifest.name == "m"


@pytest.mark.parametrize(
    "change",
    [
        {"io.inputs": [{"name": "x", "dtype": "float64", "shape": [1, 8]}]},
        {"validation.passed": False},
        {"ir.opset": 18},
    ],
)
def test_a_metadata_edit_is_caught_with_the_digest(built: tuple[Path, str], tmp_path: Path, change: dict) -> None:
    path, digest = built
    edited = _copy(path, tmp_path / "a")
    _edit(edited, change)
    result = CliRunner().invoke(main, ["verify", str(edited), "--manifest-sha256", digest])
    assert result.exit_code != 0 and result.output.startswith("error: ") and "edited after the build" in result.output
    with pytest.raises(ArtifactError, match="edited after the build"):
        aotforge.load(edited, manifest_sha256=digest)


def test_load_from_a_registry_checks_the_manifest_digest(built: tuple[Path, str], tmp_path: Path, monkeypatch) -> None:
    path, _ = built
    reg = LocalRegistry(tmp_path / "reg")
    name, version = reg.push(path)
    monkeypatch.setenv("AOTFORGE_PULL_CACHE", str(tmp_path / "cache"))
    loaded = aotforge.load(f"{name}:{version}", registry=reg)
    _edit(loaded.path, {"validation.passed": False})  # the pull cache edited afterwards
    with pytest.raises(ArtifactError, match="edited after the build"):
        aotforge.load(f"{name}:{version}", registry=reg)


def test_a_file_replaced_by_a_symlink_is_refused(built: tuple[Path, str], tmp_path: Path) -> None:
    path, digest = built
    linked = _copy(path, tmp_path / "a")
    outside = tmp_path / "outside.onnx"
    shutil.copy(linked / "model.onnx", outside)  # same bytes: the hash alone would pass
    (linked / "model.onnx").unlink()
    (linked / "model.onnx").symlink_to(outside)
    result = CliRunner().invoke(main, ["verify", str(linked)])
    assert result.exit_code != 0 and "link or special file" in result.output, result.output
    with pytest.raises(ArtifactError, match="link or special file"):
        aotforge.load(linked)


def test_every_file_byte_flip_is_caught_by_verify_and_load(built: tuple[Path, str], tmp_path: Path) -> None:
    """Flips at sampled offsets of every file (the manifest included); the whole sweep is in the fault suite."""
    path, digest = built
    rng = random.Random(0)
    caught = tried = 0
    for rel in sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()):
        size = (path / rel).stat().st_size
        for offset in sorted({0, size - 1, *(rng.randrange(size) for _ in range(4))}):
            flipped = _copy(path, tmp_path / f"f{tried}")
            raw = bytearray((flipped / rel).read_bytes())
            raw[offset] ^= 0x01 << rng.randrange(8)
            (flipped / rel).write_bytes(bytes(raw))
            tried += 1
            verify = CliRunner().invoke(main, ["verify", str(flipped), "--manifest-sha256", digest])
            with pytest.raises(ArtifactError):
                aotforge.load(flipped, manifest_sha256=digest)
            caught += verify.exit_code != 0 and verify.output.startswith("error: ")
            shutil.rmtree(flipped)
    assert caught == tried and tried >= 15


@pytest.mark.slow  # one flip per byte of every file: ~10k verify + load calls, a few minutes
def test_a_flip_of_any_byte_of_any_file_is_caught(built: tuple[Path, str], tmp_path: Path) -> None:
    """The whole sweep: every byte of every file (the manifest included) flipped in turn, a random bit each."""
    path, digest = built
    work = _copy(path, tmp_path / "a")
    rng = random.Random(16)
    tried = missed = 0
    for rel in sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()):
        good = (work / rel).read_bytes()
        for offset in range(len(good)):
            raw = bytearray(good)
            raw[offset] ^= 0x01 << rng.randrange(8)
            (work / rel).write_bytes(bytes(raw))
            verify = CliRunner().invoke(main, ["verify", str(work), "--manifest-sha256", digest])
            try:
                aotforge.load(work, manifest_sha256=digest)
                loaded = True
            except ArtifactError:
                loaded = False
            missed += verify.exit_code == 0 or not verify.output.startswith("error: ") or loaded
            tried += 1
        (work / rel).write_bytes(good)
    assert missed == 0 and tried > 1000, (missed, tried)
