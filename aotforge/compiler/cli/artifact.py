"""``aotforge targets / check / inspect / run``: what this host can target, what a target takes of a model,
and what an artifact is and does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.build_flags import given_options, option_flags
from aotforge.compiler.cli.common import manifest_summary, user_errors
from aotforge.core.errors import InputSpecError


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list: name, available, compiles, reason, details.")
def targets(as_json: bool) -> None:
    """List targets and whether this host can use them."""
    from aotforge.targets import TARGETS, get_target

    probes = {name: get_target(name).probe() for name in TARGETS}
    if as_json:
        rows = [
            {
                "name": n,
                "available": p.available,
                "compiles": p.compiles,
                "reason": p.reason,
                "details": dict(p.details),
            }
            for n, p in probes.items()
        ]
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    for name, probe in probes.items():
        state = "available" if probe.available else f"unavailable: {probe.reason}"
        if not probe.available and probe.compiles:
            state = f"compile only: {probe.reason}"
        click.echo(f"{name:12s} {state}")


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
@user_errors
def inspect(artifact: Path, as_json: bool) -> None:
    """Summarise an artifact's manifest."""
    from aotforge.artifacts.manifest import read_manifest

    manifest = read_manifest(artifact)
    click.echo(manifest.to_json() if as_json else manifest_summary(manifest.to_dict()))


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--inputs", "inputs_path", required=True, type=click.Path(path_type=Path), help=".npz with one array per input."
)
@click.option("--save", type=click.Path(path_type=Path), help="Write outputs to this .npz instead of printing.")
@user_errors
def run(artifact: Path, inputs_path: Path, save: Path | None) -> None:
    """Run ARTIFACT on the arrays in an .npz file."""
    import numpy as np

    from aotforge.artifacts import load

    try:
        with np.load(inputs_path, allow_pickle=False) as data:
            inputs = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise InputSpecError(f"cannot read inputs {inputs_path} ({e}): give an .npz written by numpy.savez") from e
    outputs = load(artifact).run(inputs)
    if save:
        np.savez(save, **outputs)  # type: ignore[arg-type]
        click.echo(str(save))
        return
    for name, value in outputs.items():
        click.echo(f"{name}: {value.dtype}{list(value.shape)}")
        click.echo(np.array2string(value, threshold=20, precision=5))


@click.command()
@click.argument("model", type=click.Path(exists=True, path_type=Path))
@option_flags("target", "target_opt", "dynamic")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def check(model: Path, as_json: bool, **kw: Any) -> None:
    """Say in seconds which ops TARGET imports, which aotforge rewrites, and which it cannot take (exit 1)."""
    import json

    from aotforge.compiler.check import check_model
    from aotforge.compiler.options import BuildOptions

    options = BuildOptions.from_dict(given_options(click.get_current_context(), kw))
    target = options.target
    report = check_model(str(model), target, dict(options.target_options), options.frontend.dynamic)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        direct = ", ".join(f"{op} x{n}" for op, n in report["direct"].items()) or "none"
        click.echo(f"{target}: imported as they are: {direct}")
        for step, what in report["rewritten"].items():
            click.echo(f"{target}: {step}: {what}")
        for refused in report["refused"]:
            click.echo(f"{target}: cannot take {refused}")
    if report["refused"]:
        raise SystemExit(1)
