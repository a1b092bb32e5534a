"""``aotforge keygen / sign / verify``: ed25519 keys, artifact signatures and the file-hash check."""

from __future__ import annotations

from pathlib import Path

import click

from aotforge.compiler.cli.common import user_errors


@click.command()
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for the key pair.")
@user_errors
def keygen(out: Path) -> None:
    """Write an ed25519 key pair: a private key PEM (mode 0600) and its public key PEM."""
    from aotforge.artifacts.signing import keygen as make_keys

    private, public = make_keys(out)
    click.echo(f"private key: {private}")
    click.echo(f"public key: {public}")


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--key", required=True, type=click.Path(path_type=Path), help="Private key PEM (aotforge keygen).")
@user_errors
def sign(artifact: Path, key: Path) -> None:
    """Sign ARTIFACT's manifest (which holds every file's sha256): writes manifest.sig."""
    from aotforge.artifacts.signing import sign as sign_artifact
    from aotforge.artifacts.signing import verified_manifest

    verified_manifest(artifact)  # never sign files that no longer match their manifest
    click.echo(str(sign_artifact(artifact, key)))


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--public-key", type=click.Path(path_type=Path), help="Also check manifest.sig with this public key.")
@click.option(
    "--manifest-sha256",
    help="Also check the manifest's own sha256 (printed by compile, the registry's digest): covers its metadata.",
)
@user_errors
def verify(artifact: Path, public_key: Path | None, manifest_sha256: str | None) -> None:
    """Check ARTIFACT's signature (with --public-key), its manifest's sha256 (with --manifest-sha256) and
    re-hash every file; non-zero exit on any mismatch."""
    from aotforge.artifacts.hashing import sha256_file
    from aotforge.artifacts.signing import is_signed, verified_manifest

    manifest = verified_manifest(artifact, public_key, manifest_sha256=manifest_sha256)
    signed = "signature NOT checked (give --public-key), " if is_signed(artifact) else ""
    signed = "signature ok, " if public_key else signed
    digest = "manifest sha256 ok, " if manifest_sha256 else ""
    click.echo(
        f"ok: {signed}{digest}{len(manifest.files)} files match the manifest "
        f"(manifest sha256 {sha256_file(artifact / 'manifest.json')})"
    )
