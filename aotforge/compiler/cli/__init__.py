"""The ``aotforge`` command line: a thin layer over ``aotforge.build`` and ``aotforge.artifacts``.

One module per command group; this one only assembles them under the root group. The commands import
the heavy libraries inside their bodies, so ``aotforge --help`` and a direct cache hit stay light.
"""

from __future__ import annotations

import logging
import warnings

import click

from aotforge.compiler.cli import artifact, bench, build, bundle, farm, generate, integrity, registry

#: Every command, by group; ``aotforge --help`` lists them by name.
COMMANDS = (
    build.compile,
    bundle.finish,
    farm.matrix,
    artifact.targets,
    artifact.inspect,
    artifact.run,
    bench.bench,
    generate.generate,
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


@click.group(commands=COMMANDS)
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
def main(debug: bool) -> None:
    """aotforge: compile a model ahead of time into a validated, benchmarked artifact."""
    if not debug:
        # The exporters' deprecation chatter buries our one-line messages; --debug keeps it.
        warnings.filterwarnings("ignore")
        logging.getLogger("torch").setLevel(logging.ERROR)


__all__ = ["COMMANDS", "main"]
