"""The flags that say where a sharded artifact's workers run (``core.placement.Placement``), shared by ``generate``
and ``serve``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from aotforge.core.placement import Placement, Spread, Workers


def placement_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--workers``, ``--spread`` and ``--ray-address``; the command gets them as one ``placement``."""
    func = click.option(
        "--spread",
        type=click.Choice([s.value.lower().replace("_", "-") for s in Spread]),
        default=Spread.PACK.value.lower(),
        show_default=True,
        help="With --workers ray: pack the stages (ranks) on as few nodes as fit, or strict-spread them one a node.",
    )(func)
    func = click.option("--ray-address", help="HEAD:PORT of the Ray cluster (default: a local Ray instance).")(func)
    return click.option(
        "--workers",
        type=click.Choice([w.value for w in Workers]),
        default=Workers.PROCESSES.value,
        show_default=True,
        help="What runs a pipeline-parallel artifact's stages or a tensor-parallel one's ranks: processes on this "
        "host, or Ray actors in a placement group (across hosts; needs ray).",
    )(func)


def placement_from(workers: str, spread: str, ray_address: str | None) -> Placement:
    return Placement(Workers(workers), ray_address, Spread(spread.upper().replace("-", "_")))
