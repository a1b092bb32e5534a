"""The ``aotforge`` command line: a thin layer over ``aotforge.build`` and ``aotforge.artifacts``.

One module per command group; this one only assembles them under the root group. The commands import
the heavy libraries inside their bodies, so ``aotforge --help`` and a direct cache hit stay light.
"""

from __future__ import annotations

import click

from aotforge.compiler.cli import artifact, bench, build, bundle, farm, generate, integrity, registry, serve, train
from aotforge.compiler.cli.progress import quiet_libraries
from aotforge.core.errors import EXIT_CODES

#: Every command, by group; ``aotforge --help`` lists them by name.
COMMANDS = (
    build.compile,
    bundle.finish,
    farm.matrix,
    artifact.targets,
    artifact.check,
    artifact.inspect,
    artifact.run,
    bench.bench,
    serve.serve,
    generate.generate,
    generate.perplexity,
    train.distill,
    train.distill_draft,
    train.qat,
    integrity.keygen,
    integrity.sign,
    integrity.verify,
    registry.push,
    registry.pull,
    registry.list_,
    registry.alias,
    registry.promote,
    registry.pack_,
)


def _epilog() -> str:
    codes = "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items())
    return (
        f"\b\nExit status:\n{codes}\n\n"
        "\b\nShell completion (bash; zsh and fish alike, with zsh_source / fish_source):\n"
        '  eval "$(_AOTFORGE_COMPLETE=bash_source aotforge)"'
    )


@click.group(commands=COMMANDS, epilog=_epilog())
@click.option("--debug", is_flag=True, help="Show full tracebacks (and the libraries' logging).")
@click.option("--verbose", "-v", is_flag=True, help="Show the libraries' warnings, logging and progress bars.")
def main(debug: bool, verbose: bool) -> None:
    """aotforge: compile a model ahead of time into a validated, benchmarked artifact."""
    if not (debug or verbose):
        # The exporters' deprecation chatter, TVM / MLflow logging and tqdm bars bury our one-line messages.
        quiet_libraries()


__all__ = ["COMMANDS", "main"]
