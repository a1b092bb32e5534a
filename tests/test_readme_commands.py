"""Every command in the shell blocks of the README and the docs/ pages it links names a real command with real flags
(or a real make target / test file), the cheap ones run, the documented shell completion works, every relative
link resolves, and no measured figure is typed into them (figures live on the generated docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

import click
from click.testing import CliRunner

from aotforge.compiler.cli import main
from tests.conftest import ROOT

_FLAG = re.compile(r"(?<![\w./=-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")


#: The pages a user reads: the README and the docs/ pages written by hand (benchmarks.md and tvm_onnx_ops.md are
#: generated from runs).
GENERATED = ("benchmarks.md", "tvm_onnx_ops.md")
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED)


def _shell_commands(pages: list[Path] = PAGES) -> list[str]:
    """The pages' sh blocks as single commands: continuations joined, comments dropped, && split."""
    text = "\n".join(page.read_text() for page in pages)
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return commands


def _aotforge_commands(pages: list[Path] = PAGES) -> list[tuple[str, list[str]]]:
    found = []
    for command in _shell_commands(pages):
        words = command.split()
        if words[0] in ("aotforge", ".venv/bin/aotforge"):
            args = [w for w in words[1:] if w not in ("--debug", "--verbose", "-v")]
            if args[1:] and args[1] in getattr(main.commands.get(args[0]), "subcommands", {}):
                args = [f"{args[0]} {args[1]}", *args[2:]]  # `aotforge bench serve ...`
            found.append((args[0], _FLAG.findall(" ".join(args[1:]))))
    return found


def test_readme_aotforge_commands_and_flags_exist() -> None:
    found = _aotforge_commands()
    assert len(found) >= 15, found  # docs/cli.md alone lists more
    assert len(_aotforge_commands([ROOT / "README.md"])) >= 10  # one CLI example per task in the README itself
    for name, flags in found:
        names = [name] if _command(name) else [n for n in name.split("|") if n in main.commands]
        assert names, f"README or docs/ use `aotforge {name}`, which is not a command"
        for command_name in names:
            command = _command(command_name)
            assert command is not None
            known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
            missing = [f for f in flags if f not in known]
            assert not missing, f"README or docs/: `aotforge {command_name}` has no {missing}"


def _command(name: str) -> click.Command | None:
    """``bench`` or ``bench serve`` (a word its command routes to a subcommand) -> the click command."""
    first, _, sub = name.partition(" ")
    command = main.commands.get(first)
    return getattr(command, "subcommands", {}).get(sub) if sub else command


def test_readme_make_targets_and_test_files_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for command in _shell_commands():
        words = command.split()
        if words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), f"no make target {words[1]}"
        for path in re.findall(r"\btests/\w+\.py\b", command):
            assert (ROOT / path).is_file(), f"README or docs/ name {path}, which does not exist"


def test_cheap_readme_commands_run_and_completion_is_documented() -> None:
    runner = CliRunner()
    for args in (["--help"], ["targets"], ["targets", "--json"], ["bench", "--help"], ["compile", "--help"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    script = runner.invoke(main, [], prog_name="aotforge", env={"_AOTFORGE_COMPLETE": "bash_source"})
    assert script.exit_code == 0 and "_aotforge_completion" in script.output
    assert "_AOTFORGE_COMPLETE=bash_source aotforge" in (ROOT / "docs" / "cli.md").read_text()
    assert "(docs/cli.md)" in (ROOT / "README.md").read_text()  # and the README links the page that says it


def test_every_relative_link_resolves() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"


#: What a measured figure looks like: a ratio, a duration, a rate, a percentage, a load average.
FIGURE = re.compile(
    r"\b\d+(\.\d+)?x\b|\b\d+(\.\d+)? ?(ms|us|µs|GB/s|MB/s|tokens/s|GFLOP/s)\b|\b\d+(\.\d+)?%|load average",
    re.IGNORECASE,
)


def test_no_figure_is_typed_into_the_readme_or_the_docs_pages() -> None:
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # commands and code are not figures
        found = [m.group(0) for m in FIGURE.finditer(text)]
        assert not found, f"{page.relative_to(ROOT)} types figures {found}: they belong on docs/benchmarks.md"


def test_supported_models_table_is_what_the_tests_build() -> None:
    """Each row of the README's supported-models table is built by the tests, and each architecture they build is
    a row (tests/hf_models.py for the encoders and vision models, tests/llm_models.py and
    tests/test_decoder_families.py for text generation)."""
    from tests.hf_models import ARCHITECTURES as ENCODERS
    from tests.llm_models import ARCHITECTURES as DECODERS
    from tests.test_decoder_families import CONFIGS

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Supported models") :].split("\n## ", 1)[0]
    rows = [
        [c.strip(" `") for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| ")
    ]
    rows = [r for r in rows[1:] if not set(r[0]) <= {"-"}]  # the header and its rule
    classes = {
        c.strip(" `").split(" ")[0].strip("`") for r in rows if r[2] != "text-generation" for c in r[1].split(",")
    }
    assert classes == {m.model_class for m in ENCODERS.values()}
    assert sorted(r[4] for r in rows) == ["yes"] * len(rows) and sorted(r[3] for r in rows) == ["yes"] * len(rows)
    # The decoders are one row naming the families of docs/text-generation.md's table, which
    # test_decoder_families.py::test_the_table_lists_the_families_tested holds equal to the configurations built.
    (generative,) = [r[0] for r in rows if r[2] == "text-generation"]
    named = [f.strip() for f in generative.split(":", 1)[1].split("(", 1)[0].split(",")]
    docs = (ROOT / "docs" / "text-generation.md").read_text()
    table = docs[docs.index("## Supported decoders") :].split("\n\n| family", 1)[1].split("\n\n", 1)[0]
    lines = table.splitlines()[2:]
    assert named == [line.strip("| ").split(" (`")[0] for line in lines]
    # The architectures every text-generation test builds (tests/llm_models.py) are rows of that table too.
    model_types = {line.split(" (`")[1].split("`)")[0] for line in lines}
    assert set(DECODERS) | {family for family, _ in CONFIGS.values()} <= model_types
