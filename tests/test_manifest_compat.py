"""Manifests written before the package became ``aotforge`` (schema 1, no file sizes) still read and
verify, and write back byte for byte; new ones are schema 2 with ``file_sizes``."""

from __future__ import annotations

import json
from pathlib import Path

from aotforge.artifacts.manifest import SCHEMA_VERSION, Manifest
from aotforge.core.target_record import TargetRecord

#: ``manifest.json`` of examples/mini_resnet.py for tvm, written by aotforge at 599e966 (top-level packages).
OLD = Path(__file__).parent / "data" / "manifest_v1_tvm.json"


def test_old_manifest_reads_into_a_typed_target_record_and_writes_back_the_same_json() -> None:
    text = OLD.read_text()
    manifest = Manifest.from_dict(json.loads(text))
    assert manifest.schema_version == 1 and SCHEMA_VERSION == 2 and manifest.file_sizes == {}
    assert isinstance(manifest.target, TargetRecord) and manifest.target.name == "tvm"
    assert manifest.target.info["target"]["kind"] == "llvm"
    assert manifest.to_json() == text


def test_an_old_artifact_still_verifies_and_new_ones_declare_sizes(tmp_path: Path) -> None:
    """A schema 1 artifact (no sizes) passes verify and unpacks; a schema 2 manifest must list every size."""
    import dataclasses

    import pytest

    from aotforge.artifacts.hashing import verify_files
    from aotforge.artifacts.manifest_shape import check_shape
    from aotforge.artifacts.packing import pack, unpack
    from aotforge.core.errors import ArtifactError

    data = json.loads(OLD.read_text())
    artifact = tmp_path / "old"
    artifact.mkdir()
    for rel in data["files"]:
        (artifact / rel).write_bytes(b"")
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    old = dataclasses.replace(Manifest.from_dict(data), files=dict.fromkeys(data["files"], empty))
    (artifact / "manifest.json").write_text(old.to_json())
    assert "file_sizes" not in old.to_json() and verify_files(artifact, old) == []
    unpacked = unpack(pack(artifact, tmp_path / "old.tar.gz"), tmp_path / "dest")
    assert verify_files(unpacked, old) == []
    new = {**old.to_dict(), "schema_version": 2, "file_sizes": dict.fromkeys(data["files"], 0)}
    check_shape(new)
    assert Manifest.from_dict(new).file_sizes == dict.fromkeys(data["files"], 0)
    for bad in ({}, {**new["file_sizes"], "x": 1}, dict.fromkeys(data["files"], -1)):
        with pytest.raises(ArtifactError, match="file_sizes"):
            Manifest.from_dict({**new, "file_sizes": bad})
    with pytest.raises(ArtifactError, match="lacks"):
        Manifest.from_dict({k: v for k, v in new.items() if k != "file_sizes"})
