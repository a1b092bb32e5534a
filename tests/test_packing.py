"""Deterministic tarballs and safe, verified unpacking."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

import aotforge
from aotforge.artifacts import LoadedArtifact
from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.packing import pack, unpack
from aotforge.core.errors import ArtifactError


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import EXAMPLES, quick_build

    out = tmp_path_factory.mktemp("build")
    return quick_build(str(EXAMPLES / "mini_resnet.py"), out, target="onnxruntime").path


def test_pack_is_deterministic(artifact: Path, tmp_path: Path) -> None:
    a = pack(artifact, tmp_path / "a.tar.gz")
    b = pack(artifact, tmp_path / "b.tar.gz")
    assert sha256_file(a) == sha256_file(b)
    with tarfile.open(a, "r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == ["manifest.json", *sorted(n for n in names if n != "manifest.json")]  # unpack reads it first
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == "" for m in members)
    assert all(m.mode == (0o755 if m.isdir() else 0o644) for m in members)


def test_pack_ignores_file_metadata(artifact: Path, tmp_path: Path) -> None:
    import os
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    for p in copy.iterdir():
        os.utime(p, (1_000_000, 1_000_000))
        p.chmod(0o600)
    assert sha256_file(pack(artifact, tmp_path / "a.tar.gz")) == sha256_file(pack(copy, tmp_path / "b.tar.gz"))


def test_unpack_round_trip_loads(artifact: Path, tmp_path: Path) -> None:

    dest = unpack(pack(artifact, tmp_path / "a.tar.gz"), tmp_path / "unpacked")
    loaded = aotforge.load(dest)
    assert loaded.run(example_inputs(loaded))


def example_inputs(loaded: LoadedArtifact) -> dict[str, np.ndarray]:
    return {
        s.name: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], dtype=s.dtype) for s in loaded.io.inputs
    }


def _tar_with(path: Path, entries: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in entries:
            data = b"x" * info.size if info.isreg() else None
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_file("../x"), "outside the artifact"),
        (_file("/etc/evil"), "outside the artifact"),
        (_file("a/../../x"), "outside the artifact"),
        (_link("escape", "../../etc/passwd", tarfile.SYMTYPE), "link"),
        (_link("hard", "/etc/passwd", tarfile.LNKTYPE), "link"),
        (_link("dev", "", tarfile.CHRTYPE), "device"),
    ],
)
def test_unpack_rejects_unsafe_entries(tmp_path: Path, entry: tarfile.TarInfo, message: str) -> None:
    bad = _tar_with(tmp_path / "bad.tar.gz", [_file("ok.txt"), entry])
    with pytest.raises(ArtifactError, match=message):
        unpack(bad, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path.parent / "x").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.tar.gz"]  # no staging dir left behind


def test_unpack_detects_tampered_tarball(artifact: Path, tmp_path: Path) -> None:
    src = pack(artifact, tmp_path / "a.tar.gz")
    with tarfile.open(src, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(tampered, "w:gz") as tar:
        for m, data in members:
            if data is not None and m.name == "model.onnx":
                data = data[:-1] + bytes([data[-1] ^ 1])
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    with pytest.raises(ArtifactError, match="model.onnx: sha256"):
        unpack(tampered, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_tamper_after_unpack_is_caught_by_load(artifact: Path, tmp_path: Path) -> None:

    dest = unpack(pack(artifact, tmp_path / "a.tar.gz"), tmp_path / "unpacked")
    target = dest / "session.json"
    target.write_bytes(target.read_bytes() + b" ")
    with pytest.raises(ArtifactError, match="session.json"):
        aotforge.load(dest)


def test_unpack_refuses_existing_dest(artifact: Path, tmp_path: Path) -> None:
    (tmp_path / "dest").mkdir()
    with pytest.raises(ArtifactError, match="already exists"):
        unpack(pack(artifact, tmp_path / "a.tar.gz"), tmp_path / "dest")


def _rewritten(src: Path, dest: Path, change) -> Path:  # type: ignore[no-untyped-def]
    """``src``'s entries, each passed through ``change(info, data) -> [(info, data), ...]``."""
    with tarfile.open(src, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(dest, "w:gz") as tar:
        for m, data in members:
            for info, new in change(m, data):
                tar.addfile(info, io.BytesIO(new) if new is not None else None)
    return dest


def test_a_decompression_bomb_is_refused_before_it_is_written(artifact: Path, tmp_path: Path) -> None:
    """Before: a 1 GiB member was written to disk in full, then refused by its hash. Now the manifest's
    declared size bounds it: 64 MiB of zeros (64 KiB compressed) in place of session.json."""
    bomb = 64 << 20

    def inflate(info: tarfile.TarInfo, data: bytes | None) -> list:
        if info.name == "session.json":
            info.size = bomb
            return [(info, bytes(bomb))]
        return [(info, data)]

    src = _rewritten(pack(artifact, tmp_path / "a.tar.gz"), tmp_path / "bomb.tar.gz", inflate)
    assert src.stat().st_size < bomb // 100
    with pytest.raises(ArtifactError, match=r"'session.json' holds 67108864 bytes where its manifest declares \d+"):
        unpack(src, tmp_path / "dest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar.gz", "bomb.tar.gz"]


def test_an_unlisted_member_is_refused_before_it_is_written(artifact: Path, tmp_path: Path) -> None:
    def add(info: tarfile.TarInfo, data: bytes | None) -> list:
        extra = tarfile.TarInfo("zz_extra.bin")
        extra.size = 4
        return [(info, data)] + ([(extra, b"abcd")] if info.name == "model.onnx" else [])

    src = _rewritten(pack(artifact, tmp_path / "a.tar.gz"), tmp_path / "extra.tar.gz", add)
    with pytest.raises(ArtifactError, match="a file its manifest does not list"):
        unpack(src, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_a_tarball_with_the_manifest_last_still_unpacks(artifact: Path, tmp_path: Path) -> None:
    """Tarballs packed before the manifest went first (sorted by path) still unpack and verify."""
    src = pack(artifact, tmp_path / "a.tar.gz")
    with tarfile.open(src, "r:gz") as tar:
        members = sorted(
            ((m, tar.extractfile(m).read() if m.isreg() else None) for m in tar.getmembers()),  # type: ignore[union-attr]
            key=lambda e: e[0].name,
        )
    old = tmp_path / "old.tar.gz"
    with tarfile.open(old, "w:gz") as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    assert aotforge.load(unpack(old, tmp_path / "dest")).manifest.file_sizes
