"""``aotforge push / pull / list / alias / promote / pack``: registries and tarballs on the command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from aotforge.compiler.cli.common import user_errors

if TYPE_CHECKING:
    from aotforge.artifacts.registry import Registry

_registry_option = click.option(
    "--registry",
    type=str,
    default=None,
    help="Registry: a local directory (default: ~/.aotforge/registry) or an http(s):// MLflow tracking URI.",
)


def _open(registry: str | None, *, create: bool = False) -> Registry:
    from aotforge.artifacts.registry import open_registry

    return open_registry(registry, create=create)


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@_registry_option
@user_errors
def push(artifact: Path, registry: str | None) -> None:
    """Push the ARTIFACT directory to the registry; prints NAME:VERSION (the same artifact keeps its version)."""
    name, version = _open(registry, create=True).push(artifact)
    click.echo(f"{name}:{version}")


@click.command()
@click.argument("ref")
@click.option("--dest", type=click.Path(path_type=Path), required=True, help="New directory for the artifact.")
@_registry_option
@user_errors
def pull(ref: str, dest: Path, registry: str | None) -> None:
    """Pull REF (NAME:VERSION or NAME@ALIAS) into --dest, verifying every file; prints its path."""
    click.echo(str(_open(registry).pull(ref, dest)))


@click.command(name="list")
@_registry_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of the registry's entries.")
@user_errors
def list_(registry: str | None, as_json: bool) -> None:
    """List the artifacts in the registry."""
    entries = _open(registry).list()
    if as_json:
        rows = [{**dataclasses.asdict(e), "ref": e.ref, "aliases": list(e.aliases)} for e in entries]
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    if not entries:
        click.echo("registry is empty")
        return
    for e in entries:
        aliases = f" @{',@'.join(e.aliases)}" if e.aliases else ""
        click.echo(f"{e.ref}\t{e.target}\t{e.digest[:12]}{aliases}")


@click.command()
@click.argument("name")
@click.argument("alias")
@click.argument("version", type=click.IntRange(min=1))
@_registry_option
@user_errors
def alias(name: str, alias: str, version: int, registry: str | None) -> None:
    """Point NAME@ALIAS at VERSION."""
    _open(registry).set_alias(name, alias, version)
    click.echo(f"{name}@{alias} -> {name}:{version}")


@click.command()
@click.argument("ref")
@click.argument("alias")
@_registry_option
@click.option("--min-cosine", type=float, default=None, help="Worst output cosine must be at least this.")
@click.option("--max-p50-ms", type=float, default=None, help="Benchmark p50 latency must be at most this.")
@click.option("--max-p99-ms", type=float, default=None, help="Benchmark p99 latency must be at most this.")
@user_errors
def promote(
    ref: str,
    alias: str,
    registry: str | None,
    min_cosine: float | None,
    max_p50_ms: float | None,
    max_p99_ms: float | None,
) -> None:
    """Point ALIAS at REF (NAME:VERSION) only if validation passed and every threshold holds."""
    from aotforge.artifacts.promotion import Gates
    from aotforge.artifacts.promotion import promote as promote_

    gates = Gates(min_cosine=min_cosine, max_p50_ms=max_p50_ms, max_p99_ms=max_p99_ms)
    name, version = promote_(_open(registry), ref, alias, gates)
    click.echo(f"{name}@{alias} -> {name}:{version}")


@click.command(name="pack")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.argument("tarball", type=click.Path(path_type=Path))
@user_errors
def pack_(artifact: Path, tarball: Path) -> None:
    """Write ARTIFACT as a deterministic TARBALL; prints its sha256."""
    from aotforge.artifacts.hashing import sha256_file
    from aotforge.artifacts.packing import pack

    click.echo(f"{sha256_file(pack(artifact, tarball))}  {tarball}")
