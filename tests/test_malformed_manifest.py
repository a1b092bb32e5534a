"""``verify`` and ``load`` on a malformed manifest: one ArtifactError, never a crash.

Before, a manifest that was a JSON list, null or a string, ``files`` as a list or null, JSON nested
100k deep (RecursionError) or ``target.name`` as a list (TypeError in ``load``) crashed both.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.cli import main
from aotforge.core.errors import ArtifactError
from tests.tiny_models import relu_add


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(m: dict[str, Any]) -> dict[str, Any]:
        node = m
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
        return m

    return edit


#: name -> the manifest's new text (from the good manifest's dict).
CASES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "list": lambda m: [m],
    "null": lambda m: None,
    "string": lambda m: "manifest",
    "number": lambda m: 1,
    "files_list": _set("files", ["model.onnx"]),
    "files_null": _set("files", None),
    "files_escape": _set("files", {"../../etc/passwd": "0" * 64}),
    "files_absolute": _set("files", {"/etc/passwd": "0" * 64}),
    "files_digest_int": _set("files", {"model.onnx": 1}),
    "target_name_list": _set("target.name", ["onnxruntime"]),
    "target_name_path": _set("target.name", "../onnxruntime"),
    "target_list": _set("target", ["onnxruntime"]),
    "target_options_list": _set("target.options", [1]),
    "version_string": _set("version", "1"),
    "version_bool": _set("version", True),
    "version_zero": _set("version", 0),
    "name_int": _set("name", 7),
    "io_null": _set("io", None),
    "io_inputs_null": _set("io.inputs", None),
    "io_dtype_garbage": lambda m: _set("io.inputs", [{**m["io"]["inputs"][0], "dtype": "float99"}])(m),
    "io_shape_nested": lambda m: _set("io.inputs", [{**m["io"]["inputs"][0], "shape": [[1]]}])(m),
    "passes_strings": _set("passes", ["fold"]),
    "benchmark_list": _set("benchmark", []),
    "schema_string": _set("schema_version", "1"),
}
RAW: dict[str, bytes] = {
    "deep_list": b"[" * 100_000 + b"]" * 100_000,
    "deep_object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "truncated": b'{"name": "m", "vers',
    "not_utf8": b'{"name": "\xff\xfe"}',
    "empty": b"",
}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import quick_build

    tmp = tmp_path_factory.mktemp("malformed")
    return quick_build(str(relu_add(tmp / "m.onnx")), tmp / "out", target="onnxruntime").path


def _broken(artifact: Path, dest: Path, case: str) -> Path:
    shutil.copytree(artifact, dest)
    if case in RAW:
        raw = RAW[case]
    else:
        raw = json.dumps(CASES[case](json.loads((artifact / "manifest.json").read_text()))).encode()
    (dest / "manifest.json").write_bytes(raw)
    return dest


@pytest.mark.parametrize("case", sorted(CASES) + sorted(RAW))
def test_malformed_manifest_is_one_clear_error(artifact: Path, tmp_path: Path, case: str) -> None:
    broken = _broken(artifact, tmp_path / "a", case)
    with pytest.raises(ArtifactError, match="corrupt|not a valid|not an aotforge|cannot read it"):
        aotforge.load(broken)
    result = CliRunner().invoke(main, ["verify", str(broken)])
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


def test_the_good_manifest_still_loads(artifact: Path) -> None:
    assert aotforge.load(artifact).manifest.name == "m"
