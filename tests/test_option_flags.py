"""The build options are spelled in one place: every field has a flag, every flag a field, each default written once
(in the field), and the Python keywords users write today still land in the right group."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.cli.bench import bench as bench_command
from aotforge.compiler.cli.build import compile as compile_command
from aotforge.compiler.cli.build_flags import cli_default
from aotforge.compiler.option_flags import BY_KEYWORD, FLAGS
from aotforge.compiler.options import BuildOptions, field_default, field_paths
from aotforge.core.errors import OptionsError


def _params(command: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in command.params if p.name is not None}


def test_every_field_has_a_flag_and_every_flag_a_field() -> None:
    paths = set(field_paths())
    flagged = {f.path for f in FLAGS if f.cli}
    assert sorted(paths - flagged) == [], "fields without a flag"
    groups = {p.rsplit(".", 1)[0] for p in paths if "." in p}
    assert sorted({f.path for f in FLAGS} - paths - groups) == [], "flags without a field"
    assert len(BY_KEYWORD) == len(FLAGS), "two flags with one keyword"


def test_compile_has_each_flag_with_its_fields_default() -> None:
    """The click defaults are the fields' (read from them), so parsing them back gives the default options."""
    params = _params(compile_command)
    cli = [f for f in FLAGS if f.cli]
    assert all(f.keyword in params for f in cli)
    defaults = {f.keyword: params[f.keyword].default for f in cli}
    assert defaults == {f.keyword: cli_default(f) for f in cli}
    given = {k: v for k, v in defaults.items() if v not in (None, ())}
    assert BuildOptions.from_dict(given) == BuildOptions()


def test_no_default_is_written_in_the_cli_modules() -> None:
    """A flag's default lives in its field: the compile command's module writes none of them again."""
    source = (Path(__file__).parents[1] / "aotforge/compiler/cli/build.py").read_text()
    for flag in FLAGS:
        assert f'"--{flag.keyword.replace("_", "-")}"' not in source, flag.keyword


def test_bench_command_defaults_are_the_bench_options() -> None:
    params, defaults = _params(bench_command), BenchOptions()
    assert params["seconds"].default == defaults.max_seconds
    assert params["warmup"].default == defaults.warmup and params["max_runs"].default == defaults.max_runs


@pytest.mark.parametrize(
    ("keywords", "path", "value"),
    [
        ({"max_seq_len": 64}, "generation.max_seq_len", 64),
        ({"generation": {"max_batch": 2}}, "generation.max_batch", 2),
        ({"generation.speculative_k": 3}, "generation.speculative_k", 3),
        ({"tolerance": 0.5}, "validation.tolerance", 0.5),
        ({"bench": False}, "benchmark.bench", False),
        ({"no_bench": True}, "benchmark.bench", False),
        ({"bench_seconds": 2}, "benchmark.runs.max_seconds", 2),
        ({"bench_options": {"max_runs": 7}}, "benchmark.runs.max_runs", 7),
        ({"passes": "O2,fold"}, "passes.names", ("O2", "fold")),
        ({"pass_params": {"int8": {"method": "minmax"}}}, "passes.params", {"int8": {"method": "minmax"}}),
        ({"backend_deadline_s": 60.0}, "isolation.backend_deadline_s", 60.0),
        ({"isolate_backend": False}, "isolation.isolate_backend", False),
        ({"dump_ir": "ir"}, "passes.dump_ir", Path("ir")),
    ],
)
def test_flat_keywords_land_in_their_group(keywords: dict[str, object], path: str, value: object) -> None:
    fields = BuildOptions.from_dict(keywords).fields()
    assert fields[path] == value
    assert all(v == field_default(p) for p, v in fields.items() if p != path)


def test_unknown_keyword_and_bad_value_are_refused_by_name() -> None:
    with pytest.raises(OptionsError, match="unknown build option.*max_seq"):
        BuildOptions.from_dict({"max_seq": 3})
    with pytest.raises(OptionsError, match="generation has: .*max_seq_len"):
        BuildOptions.from_dict({"generation": {"max_seq": 3}})
    with pytest.raises(OptionsError, match="max_seq_len must be >= 2"):
        BuildOptions.from_dict({"max_seq_len": 1})
    with pytest.raises(OptionsError, match="eval_text .* is not a file"):
        BuildOptions.from_dict({"eval_text": "no-such-text.txt"})
