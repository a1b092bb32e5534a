"""Signed artifacts: every single-byte change to any file is refused, naming the file, before loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import aotforge
from aotforge.artifacts.hashing import SIGNATURE, sha256_file
from aotforge.artifacts.manifest import MANIFEST
from aotforge.artifacts.signing import keygen, sign, verified_manifest
from aotforge.core.errors import ArtifactError, SignatureError
from tests.conftest import CPU_TARGETS, EXAMPLES, quick_build
from tests.test_errors import invoke_cli


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keygen(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module", params=CPU_TARGETS)
def signed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    out = tmp_path_factory.mktemp(f"signed-{request.param}")
    path = quick_build(str(EXAMPLES / "mini_resnet.py"), out, target=request.param).path
    sign(path, keys[0])
    return path


def test_keygen_private_key_is_owner_only(keys: tuple[Path, Path]) -> None:
    assert keys[0].stat().st_mode & 0o777 == 0o600
    assert b"PUBLIC KEY" in keys[1].read_bytes()


def test_signed_artifact_verifies_and_loads(signed: Path, keys: tuple[Path, Path]) -> None:
    manifest = verified_manifest(signed, keys[1])
    assert SIGNATURE not in manifest.files and (signed / SIGNATURE).is_file()
    assert aotforge.load(signed, public_key=keys[1]).manifest.name == manifest.name


def _every_file(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_file())


def test_one_flipped_byte_in_any_file_is_refused(signed: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    """Every file of the signed artifact, each flipped in a copy of its own: the loader and ``verify`` refuse."""
    names = _every_file(signed)
    assert SIGNATURE in names and MANIFEST in names and len(names) >= 4, names
    for name in names:
        copy = tmp_path / name
        shutil.copytree(signed, copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))
        shown = MANIFEST if name == SIGNATURE else name  # a bad signature is reported against the manifest it covers
        with pytest.raises(ArtifactError, match=rf"{SIGNATURE}|{shown}"):
            aotforge.load(copy, public_key=keys[1])
        proc = invoke_cli("verify", str(copy), "--public-key", str(keys[1]))
        assert proc.returncode != 0 and name.split(".")[0] in proc.stderr, (name, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1, (name, proc.stderr)


def test_rehashed_tamper_is_caught_by_the_signature(signed: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    copy = tmp_path / "a"
    shutil.copytree(signed, copy)
    (copy / "model.onnx").write_bytes((copy / "model.onnx").read_bytes() + b"\0")
    data = json.loads((copy / MANIFEST).read_text())
    data["files"]["model.onnx"] = sha256_file(copy / "model.onnx")
    data["file_sizes"]["model.onnx"] = (copy / "model.onnx").stat().st_size
    (copy / MANIFEST).write_text(json.dumps(data, sort_keys=True, indent=2) + "\n")
    verified_manifest(copy)  # hashes alone are fooled ...
    with pytest.raises(SignatureError, match="does not match its signature"):
        aotforge.load(copy, public_key=keys[1])  # ... the signature is not


def test_unsigned_or_wrong_key_is_refused(signed: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    copy = tmp_path / "a"
    shutil.copytree(signed, copy)
    (copy / SIGNATURE).unlink()
    with pytest.raises(SignatureError, match="is not signed"):
        aotforge.load(copy, public_key=keys[1])
    _, other = keygen(tmp_path / "other")
    with pytest.raises(SignatureError, match="not by the given public key"):
        aotforge.load(signed, public_key=other)
