"""The README's Python API block runs as written (a new user copies it first)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_python_api_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The Python API") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    code = block.group(1).replace('"examples/', f'"{ROOT}/examples/')
    monkeypatch.chdir(tmp_path)  # artifacts go to ./out, as they would for the user
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "logits" in printed and os.path.isdir(printed.split()[0])
