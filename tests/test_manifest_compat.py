"""Manifests written before the package became ``aotforge`` (schema 1) still read, byte for byte."""

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
    assert manifest.schema_version == SCHEMA_VERSION == 1
    assert isinstance(manifest.target, TargetRecord) and manifest.target.name == "tvm"
    assert manifest.target.info["target"]["kind"] == "llvm"
    assert manifest.to_json() == text
