"""The README's Python blocks run as written (a new user copies them first): the build, then the registry."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT


def _python_block(heading: str) -> str:
    """The first python block under the README's ``heading``, its example paths made absolute."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading) :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, f"README: no python block under {heading!r}"
    return block.group(1).replace('"examples/', f'"{ROOT}/examples/')


def _run(code: str, namespace: dict[str, Any]) -> None:
    exec(compile(code, "README.md", "exec"), namespace)


def test_python_api_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)  # artifacts go to ./out, as they would for the user
    _run(_python_block("## Compile an encoder or vision model"), {})
    printed = capsys.readouterr().out
    assert "logits" in printed and os.path.isdir(printed.split()[0])


def test_registry_block_runs_after_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the default registry and pull cache live under ~
    monkeypatch.delenv("AOTFORGE_PULL_CACHE", raising=False)
    namespace: dict[str, Any] = {}
    _run(_python_block("## Compile an encoder or vision model"), namespace)
    capsys.readouterr()
    _run(_python_block("## Push, pull and sign"), namespace)
    name, version, outputs = capsys.readouterr().out.split(maxsplit=2)
    assert (name, version) == ("mini_resnet", "1") and "logits" in outputs
    assert (tmp_path / "home" / ".aotforge" / "registry").is_dir()
    assert (namespace["result"].path / "manifest.sig").is_file()
