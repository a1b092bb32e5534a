"""Every command in the README's shell blocks names a real command with real flags (or a real make target /
test file), the cheap ones run, and the documented shell completion works."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from aotforge.compiler.cli import main
from tests.conftest import ROOT

_FLAG = re.compile(r"(?<![\w./=-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")


def _shell_commands() -> list[str]:
    """The README's sh blocks as single commands: continuations joined, comments dropped, && split."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return commands


def _aotforge_commands() -> list[tuple[str, list[str]]]:
    found = []
    for command in _shell_commands():
        words = command.split()
        if words[0] in ("aotforge", ".venv/bin/aotforge"):
            args = [w for w in words[1:] if w not in ("--debug", "--verbose", "-v")]
            found.append((args[0], _FLAG.findall(" ".join(args[1:]))))
    return found


def test_readme_aotforge_commands_and_flags_exist() -> None:
    found = _aotforge_commands()
    assert len(found) >= 15, found  # the CLI section alone lists more
    for name, flags in found:
        names = [name] if name in main.commands else [n for n in name.split("|") if n in main.commands]
        assert names, f"README uses `aotforge {name}`, which is not a command"
        for command_name in names:
            command: click.Command = main.commands[command_name]
            known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
            missing = [f for f in flags if f not in known]
            assert not missing, f"README: `aotforge {command_name}` has no {missing}"


def test_readme_make_targets_and_test_files_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for command in _shell_commands():
        words = command.split()
        if words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), f"no make target {words[1]}"
        for path in re.findall(r"\btests/\w+\.py\b", command):
            assert (ROOT / path).is_file(), f"README names {path}, which does not exist"


def test_cheap_readme_commands_run_and_completion_is_documented() -> None:
    runner = CliRunner()
    for args in (["--help"], ["targets"], ["targets", "--json"], ["bench", "--help"], ["compile", "--help"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    script = runner.invoke(main, [], prog_name="aotforge", env={"_AOTFORGE_COMPLETE": "bash_source"})
    assert script.exit_code == 0 and "_aotforge_completion" in script.output
    assert "_AOTFORGE_COMPLETE=bash_source aotforge" in (ROOT / "README.md").read_text()
