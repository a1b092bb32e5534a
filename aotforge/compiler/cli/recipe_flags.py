"""``aotforge compile --recipe``: a TOML recipe's options, with the flags given on the command line over them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

#: BuildOptions field -> the compile flag that sets it, for fields a recipe can hold.
_RECIPE_FLAGS = {
    "target": "target",
    "passes": "passes",
    "pass_params": "pass_opt",
    "target_options": "target_opt",
    "tolerance": "tolerance",
    "sample_inputs": "sample_inputs",
    "dynamic": "dynamic",
    "input_ranges": "input_range",
    "name": "name",
    "calibration": "calibration",
    "accuracy_budget": "accuracy_budget",
    "task": "task",
}


def with_recipe(path: Path, options: Any, ctx: click.Context) -> Any:
    """The recipe's values, replaced by flags given on the command line (option tables merged)."""
    from click.core import ParameterSource

    from aotforge.compiler.options import BuildOptions
    from aotforge.compiler.recipe import load_recipe

    values = {**load_recipe(path)}
    for field, flag in _RECIPE_FLAGS.items():
        flags = (flag, "tune_trials", "tune_minutes") if field == "target_options" else (flag,)
        if all(ctx.get_parameter_source(f) in (ParameterSource.DEFAULT, None) for f in flags):
            continue
        given = getattr(options, field)
        if field == "pass_params":
            merged = {k: dict(v) for k, v in values.get(field, {}).items()}
            for name, params in given.items():
                merged.setdefault(name, {}).update(params)
            given = merged
        elif field == "target_options":
            given = {**values.get(field, {}), **given}
        values[field] = given
    rest = {f: getattr(options, f) for f in ("out", "version", "bench", "bench_options", "dump_ir", "cache_dir")}
    return BuildOptions.from_dict({**values, **rest, "prepare_only": options.prepare_only})
