"""``aotforge compile --target a,b`` and ``aotforge matrix PLAN.toml``: build farms on the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.common import user_errors
from aotforge.core.errors import EXIT_PARTIAL

#: Exit status when a requested target (a plan entry) failed, after every other one finished.
EXIT_SOME_FAILED = EXIT_PARTIAL


def compile_many(model: str, options: Any, kw: dict[str, Any]) -> None:
    """The multi-target tail of ``compile``: the comparison table on stderr, each artifact's path on stdout."""
    from rich.console import Console

    from aotforge.compiler.farm.multi import build_many

    console = Console(stderr=True)
    with console.status("building") as status:
        result = build_many(model, options, options.target, progress=status.update)
    _print(console, result)
    for row in result.rows:
        if row["status"] == "failed":
            continue
        path = Path(row["path"])
        if kw.get("sign_key"):
            from aotforge.artifacts.signing import sign

            sign(path, kw["sign_key"])
        if kw.get("push_to"):
            from aotforge.artifacts.registry import open_registry

            ref_name, ref_version = open_registry(kw["push_to"], create=True).push(path)
            console.print(f"pushed {row['target']} as {ref_name}:{ref_version}", markup=False, soft_wrap=True)
        click.echo(str(path))
    if not result.ok:
        sys.exit(EXIT_SOME_FAILED)


def _print(console: Any, result: Any) -> None:
    console.print(result.table(), markup=False, highlight=False, soft_wrap=True)
    for target, why in result.skipped.items():
        console.print(f"skipped {target}: {why}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"comparison: {', '.join(str(p) for p in result.files.values())}", markup=False, soft_wrap=True)


@click.command()
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--out", "-o", type=click.Path(path_type=Path), help="Artifacts and the summary (default: the plan's).")
@click.option(
    "--executor",
    default="local",
    show_default=True,
    help="local (worker processes here) or ray[=ADDRESS] (auto, ray://host:10001; none: a local Ray instance).",
)
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="local: workers at a time (default: cores and memory).")
@click.option("--push", "push_to", help="Push every passing artifact to this registry (overrides the plan's).")
@user_errors
def matrix(plan: Path, out: Path | None, executor: str, jobs: int | None, push_to: str | None) -> None:
    """Build every model x target of PLAN (TOML) that is not already built, keep going past failures, and write
    one summary (matrix.json / .md / .png); exits non-zero if any build failed."""
    import dataclasses

    from rich.console import Console

    from aotforge.compiler.farm.executors import LocalExecutor
    from aotforge.compiler.farm.matrix import run_plan
    from aotforge.compiler.farm.plan import load_plan

    loaded = load_plan(plan)
    if push_to:
        loaded = dataclasses.replace(loaded, push=push_to)
    where = out or loaded.out or Path("out")
    console = Console(stderr=True)
    local = LocalExecutor(jobs or loaded.jobs)
    kind, _, address = executor.partition("=")
    with local, console.status("building") as status:
        if kind == "local" and not address:
            result = run_plan(loaded, where, local, local=local, progress=status.update)
        elif kind == "ray":
            from aotforge.compiler.farm.ray_executor import RayExecutor

            remote = RayExecutor(address or None)
            try:
                result = run_plan(loaded, where, remote, local=local, progress=status.update)
            finally:
                remote.close()
        else:
            raise click.BadParameter(f"{executor!r}: give local or ray[=ADDRESS]", param_hint="--executor")
    _print(console, result)
    click.echo(str(result.files["md"]))
    if not result.ok:
        sys.exit(EXIT_SOME_FAILED)
