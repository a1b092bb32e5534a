"""Names, versions, aliases and registry refs are one path component of a safe alphabet everywhere.

Before this, ``compile --name ../../../esc`` wrote the artifact outside ``--out`` and exited 0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.artifacts.local_registry import LocalRegistry, parse_ref
from aotforge.artifacts.manifest import read_manifest
from aotforge.artifacts.names import check_name, safe_name
from aotforge.compiler.build_tail import place_artifact
from aotforge.compiler.cli import main
from aotforge.core.errors import AotforgeError, ArtifactError
from tests.tiny_models import relu_add

HOSTILE = [
    "../../../esc",
    "..",
    ".",
    "/abs/dir",
    "a/b",
    "a\\b",
    ".hidden",
    "-rf",
    "a b",
    "x'y",
    "a\0b",
    "",
    "é",
    "a" * 129,
]


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.mark.parametrize("name", HOSTILE)
def test_check_name_refuses(name: str) -> None:
    with pytest.raises(ArtifactError, match="not a valid artifact name"):
        check_name(name)


@pytest.mark.parametrize("name", ["resnet", "mini_resnet-2.1", "A0", "a" * 128])
def test_check_name_accepts(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["../../../esc", "/abs/esc", "a/b"])
def test_compile_refuses_a_path_like_name_and_writes_nothing(tmp_path: Path, name: str) -> None:
    work = tmp_path / "work"
    out = work / "a" / "b" / "out"
    model = relu_add(tmp_path / "m.onnx")
    if name.startswith("/"):
        name = str(tmp_path / "abs" / "esc")
    before = _files(tmp_path)
    result = CliRunner().invoke(
        main, ["compile", str(model), "--target", "onnxruntime", "--out", str(out), "--name", name, "--no-bench"]
    )
    assert result.exit_code != 0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: --name") and "not a valid artifact name" in lines[-1], result.output
    assert "Traceback" not in result.output
    assert _files(tmp_path) == before  # nothing anywhere: not --out, not beside it, not the absolute path


def test_place_artifact_refuses_a_hostile_bundle_draft(tmp_path: Path) -> None:
    # ``finish`` takes the name and version from a bundle file someone else wrote.
    with pytest.raises(AotforgeError, match="not a valid artifact name"):
        place_artifact(tmp_path, "../esc", None, "onnxruntime")
    with pytest.raises(AotforgeError, match="not a valid artifact version"):
        place_artifact(tmp_path, "ok", -1, "onnxruntime")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("ref", ["../x:1", "/abs:1", "a/b:2", "ok@../x", "ok@a/b", "../x@prod", "x'y:1"])
def test_registry_refs_refuse_path_like_parts(ref: str) -> None:
    with pytest.raises(ArtifactError):
        parse_ref(ref)


def test_alias_refuses_path_like_names(tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "reg")
    for name, alias in (("../x", "prod"), ("ok", "../prod"), ("ok", "a/b")):
        with pytest.raises(ArtifactError, match="not a valid artifact name"):
            reg.set_alias(name, alias, 1)


@pytest.mark.parametrize("name", ["../../esc", "/etc", "a/b"])
def test_a_manifest_with_a_path_like_name_is_corrupt(tmp_path: Path, name: str) -> None:
    from tests.conftest import quick_build

    art = quick_build(str(relu_add(tmp_path / "m.onnx")), tmp_path / "out", target="onnxruntime").path
    bad = tmp_path / "bad"
    shutil.copytree(art, bad)
    data = json.loads((bad / "manifest.json").read_text())
    data["name"] = name
    (bad / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="manifest name"):
        read_manifest(bad)
    with pytest.raises(ArtifactError, match="manifest name"):
        LocalRegistry(tmp_path / "reg").push(bad)


def test_a_default_name_from_an_odd_file_name_is_made_safe(tmp_path: Path) -> None:
    from tests.conftest import quick_build

    assert safe_name("my model+v2") == "my_model_v2"
    assert safe_name("..") == "model"
    result = quick_build(str(relu_add(tmp_path / "my model+v2.onnx")), tmp_path / "out", target="onnxruntime")
    assert result.manifest.name == "my_model_v2"
    assert result.path == tmp_path / "out" / "my_model_v2" / "1" / "onnxruntime"
