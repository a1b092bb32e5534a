"""``aotforge keygen / sign``: ed25519 keys and artifact signatures on the command line."""

from __future__ import annotations

from pathlib import Path

import click


def register_integrity_commands(group: click.Group) -> None:
    """Add the signing commands to ``group`` (the ``aotforge`` click group)."""
    from aotforge.compiler.cli import user_errors

    @group.command()
    @click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for the key pair.")
    @user_errors
    def keygen(out: Path) -> None:
        """Write an ed25519 key pair: a private key PEM (mode 0600) and its public key PEM."""
        from aotforge.artifacts.signing import keygen as make_keys

        private, public = make_keys(out)
        click.echo(f"private key: {private}")
        click.echo(f"public key: {public}")

    @group.command()
    @click.argument("artifact", type=click.Path(path_type=Path))
    @click.option("--key", required=True, type=click.Path(path_type=Path), help="Private key PEM (aotforge keygen).")
    @user_errors
    def sign(artifact: Path, key: Path) -> None:
        """Sign ARTIFACT's manifest (which holds every file's sha256): writes manifest.sig."""
        from aotforge.artifacts.signing import sign as sign_artifact
        from aotforge.artifacts.signing import verified_manifest

        verified_manifest(artifact)  # never sign files that no longer match their manifest
        click.echo(str(sign_artifact(artifact, key)))
