"""Signatures other tools verify: the OpenSSF ``model-signing`` library's key-based bundles (``model.sig``).

``aotforge sign --key EC_PRIVATE.pem`` writes ``model.sig`` in the artifact, a Sigstore bundle (DSSE
envelope over an in-toto statement listing every file's sha256) made by ``model_signing`` with an
elliptic-curve key, offline. So ``model_signing verify key ARTIFACT --signature ARTIFACT/model.sig
--public_key EC_PUBLIC.pem`` verifies an aotforge artifact, and ``aotforge verify ARTIFACT
--public-key EC_PUBLIC.pem`` checks a bundle made by ``model_signing sign key``. The bundle covers
``manifest.json`` too, so its bytes are as trusted as with the ed25519 ``manifest.sig``
(``artifacts.signing``), which stays as it was. The key's type picks the scheme.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aotforge.core.errors import SignatureError, describe

__all__ = ["BUNDLE", "keygen_ec", "sign_bundle", "verify_bundle"]

from aotforge.artifacts.hashing import BUNDLE
from aotforge.artifacts.key_files import write_key_pair

PRIVATE_KEY = "aotforge-ec.key.pem"
PUBLIC_KEY = "aotforge-ec.pub.pem"


def keygen_ec(out_dir: Path) -> tuple[Path, Path]:
    """An EC P-256 key pair for ``model_signing``: private key PEM (0600) and public key PEM."""
    from cryptography.hazmat.primitives.asymmetric import ec

    out_dir.mkdir(parents=True, exist_ok=True)
    return write_key_pair(ec.generate_private_key(ec.SECP256R1()), out_dir / PRIVATE_KEY, out_dir / PUBLIC_KEY)


def _hashing() -> Any:
    from model_signing import hashing

    # Paths relative to the artifact (what `model_signing sign` records too): the bundle cannot hash itself.
    return hashing.Config().set_ignored_paths(paths=[Path(BUNDLE)], ignore_git_paths=True)


def sign_bundle(root: Path, private_key: Path) -> Path:
    """Sign every file of the artifact at ``root`` with ``model_signing``; writes ``root/model.sig``."""
    signing = _module("signing")
    try:
        config = signing.Config().use_elliptic_key_signer(private_key=private_key)
        config.set_hashing_config(_hashing()).sign(root, root / BUNDLE)
    except Exception as e:  # model_signing raises ValueError / its own errors; the key or the files are at fault
        raise SignatureError(f"model_signing could not sign {root} with {private_key}: {describe(e)}") from e
    return root / BUNDLE


def verify_bundle(root: Path, public_key: Path) -> None:
    """Check ``root/model.sig`` with ``model_signing`` against every file of the artifact."""
    if not (root / BUNDLE).is_file():
        raise SignatureError(
            f"{root} has no {BUNDLE} but an EC public key was given: sign it with `aotforge sign {root} --key "
            "EC_PRIVATE.pem` (or `model_signing sign key`), or verify with the key that signed it"
        )
    verifying = _module("verifying")
    try:
        config = verifying.Config().use_elliptic_key_verifier(public_key=public_key)
        config.set_hashing_config(_hashing()).verify(root, root / BUNDLE)
    except Exception as e:
        raise SignatureError(
            f"{BUNDLE} of {root} does not verify with {public_key} ({describe(e)}): the files or the bundle were "
            "modified after signing, or another key signed it; pull or rebuild the artifact, do not load it"
        ) from e


def _module(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(f"model_signing.{name}")
    except ImportError as e:
        raise SignatureError(
            f"EC keys sign through the OpenSSF model-signing library, which is not importable here ({e}): "
            "pip install 'aotforge[signing]'"
        ) from e
