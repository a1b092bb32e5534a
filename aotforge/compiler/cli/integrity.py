"""``aotforge keygen / sign / verify``: ed25519 keys, artifact signatures and the file-hash check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from aotforge.compiler.cli.common import user_errors
from aotforge.core.errors import AotforgeError


@click.command()
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for the key pair.")
@click.option(
    "--scheme",
    type=click.Choice(["ed25519", "openssf"]),
    default="ed25519",
    show_default=True,
    help="ed25519: manifest.sig over the manifest; openssf: an EC P-256 key for OpenSSF model-signing "
    "bundles (model.sig) that `model_signing verify key` checks too.",
)
@user_errors
def keygen(out: Path, scheme: str) -> None:
    """Write a key pair: a private key PEM (mode 0600) and its public key PEM."""
    if scheme == "openssf":
        from aotforge.artifacts.openssf_signing import keygen_ec as make_keys
    else:
        from aotforge.artifacts.signing import keygen as make_keys

    private, public = make_keys(out)
    click.echo(f"private key: {private}")
    click.echo(f"public key: {public}")


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--key",
    required=True,
    type=click.Path(path_type=Path),
    help="Private key PEM (aotforge keygen [--scheme openssf]).",
)
@user_errors
def sign(artifact: Path, key: Path) -> None:
    """Sign ARTIFACT: an ed25519 key writes manifest.sig (over the manifest, which holds every file's sha256);
    an EC key writes an OpenSSF model-signing bundle model.sig over every file."""
    from aotforge.artifacts.signing import sign as sign_artifact
    from aotforge.artifacts.signing import verified_manifest

    verified_manifest(artifact)  # never sign files that no longer match their manifest
    click.echo(str(sign_artifact(artifact, key)))


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--public-key",
    type=click.Path(path_type=Path),
    help="Also check the signature: manifest.sig (ed25519 key) or the model-signing bundle model.sig (EC key).",
)
@click.option(
    "--manifest-sha256",
    help="Also check the manifest's own sha256 (printed by compile, the registry's digest): covers its metadata.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (ok, error, exit_code, files ...).")
@user_errors
def verify(artifact: Path, public_key: Path | None, manifest_sha256: str | None, as_json: bool) -> None:
    """Check ARTIFACT's signature (with --public-key), its manifest's sha256 (with --manifest-sha256) and
    re-hash every file; non-zero exit on any mismatch (4: integrity or signature)."""
    from aotforge.artifacts.hashing import sha256_file
    from aotforge.artifacts.signing import is_signed, verified_manifest

    try:
        manifest = verified_manifest(artifact, public_key, manifest_sha256=manifest_sha256)
    except AotforgeError as e:
        if not as_json:
            raise
        click.echo(json.dumps({"ok": False, "path": str(artifact), "error": str(e), "exit_code": e.exit_code}))
        sys.exit(e.exit_code)
    signature = "checked" if public_key else ("not checked" if is_signed(artifact) else "unsigned")
    if as_json:
        report = {
            "ok": True,
            "path": str(artifact),
            "name": manifest.name,
            "version": manifest.version,
            "target": manifest.target.name,
            "files": len(manifest.files),
            "signature": signature,
            "manifest_sha256": sha256_file(artifact / "manifest.json"),
        }
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    signed = "signature NOT checked (give --public-key), " if is_signed(artifact) else ""
    signed = "signature ok, " if public_key else signed
    digest = "manifest sha256 ok, " if manifest_sha256 else ""
    click.echo(
        f"ok: {signed}{digest}{len(manifest.files)} files match the manifest "
        f"(manifest sha256 {sha256_file(artifact / 'manifest.json')})"
    )
