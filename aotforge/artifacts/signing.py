"""ed25519 signatures over an artifact's exact ``manifest.json`` bytes.

The manifest carries every file's sha256, so one signature over its bytes covers every file:
verify the signature, then the hashes. ``manifest.sig`` is JSON naming the algorithm, the
signing key's id (sha256 of its raw public bytes, so a wrong key is named as such) and the
base64 signature. Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.artifacts.hashing import SIGNATURE, require_intact
from aotforge.artifacts.key_files import write_key_pair
from aotforge.artifacts.manifest import MANIFEST, Manifest, manifest_from_bytes, read_manifest_bytes
from aotforge.core.errors import ArtifactError, SignatureError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "ed25519"
PRIVATE_KEY = "aotforge.key.pem"
PUBLIC_KEY = "aotforge.pub.pem"


def keygen(out_dir: str | Path) -> tuple[Path, Path]:
    """Write a new key pair into ``out_dir``: the private key readable by its owner only (0600)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_key_pair(Ed25519PrivateKey.generate(), out / PRIVATE_KEY, out / PUBLIC_KEY)


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = _load_pem(path, lambda data: serialization.load_pem_private_key(data, password=None), "private")
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{path} is not an ed25519 private key: make one with `aotforge keygen`")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = _load_pem(path, serialization.load_pem_public_key, "public")
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError(f"{path} is not an ed25519 public key: use the .pub.pem from `aotforge keygen`")
    return key


def _load_pem(path: str | Path, parse: Any, kind: str) -> Any:
    try:
        return parse(Path(path).read_bytes())
    except OSError as e:
        raise SignatureError(f"cannot read {kind} key {path} ({e.strerror}): check the path") from e
    except (ValueError, TypeError) as e:
        raise SignatureError(f"{path} is not a PEM {kind} key ({e}): make one with `aotforge keygen`") from e


def key_id(public_key: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(artifact_dir: str | Path, private_key: str | Path | Ed25519PrivateKey) -> Path:
    """Write ``manifest.sig`` beside the manifest: a signature over its exact bytes. With an EC key, an OpenSSF
    ``model_signing`` bundle ``model.sig`` over every file instead (``artifacts.openssf_signing``)."""
    root = Path(artifact_dir)
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise SignatureError(f"{root} is not an aotforge artifact: it has no {MANIFEST} to sign")
    if isinstance(private_key, (str, Path)) and _is_ec(private_key, private=True):
        from aotforge.artifacts.openssf_signing import sign_bundle

        return sign_bundle(root, Path(private_key))  # an OpenSSF model-signing bundle, model.sig
    key = private_key if not isinstance(private_key, (str, Path)) else load_private_key(private_key)
    signature = key.sign(manifest.read_bytes())
    record = {
        "algorithm": ALGORITHM,
        "key_id": key_id(key.public_key()),
        "signature": base64.b64encode(signature).decode(),
    }
    path = root / SIGNATURE
    tmp = root / f".{SIGNATURE}.tmp"
    tmp.write_text(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)  # a reader never sees half a signature
    return path


def is_signed(artifact_dir: str | Path) -> bool:
    from aotforge.artifacts.openssf_signing import BUNDLE

    return any((Path(artifact_dir) / name).is_file() for name in (SIGNATURE, BUNDLE))


def _is_ec(path: str | Path, *, private: bool) -> bool:
    """Whether the PEM at ``path`` holds an elliptic-curve key (the OpenSSF model-signing scheme)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if private:
        key = _load_pem(path, lambda data: serialization.load_pem_private_key(data, password=None), "private")
    else:
        key = _load_pem(path, serialization.load_pem_public_key, "public")
    return isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey))


def verify_signature(artifact_dir: str | Path, public_key: str | Path | Ed25519PublicKey) -> bytes:
    """Check ``manifest.sig`` against the manifest's bytes; return those bytes (parse these, not a re-read)."""
    from cryptography.exceptions import InvalidSignature

    root = Path(artifact_dir)
    if isinstance(public_key, (str, Path)) and _is_ec(public_key, private=False):
        from aotforge.artifacts.openssf_signing import verify_bundle

        verify_bundle(root, Path(public_key))  # every file, manifest.json included
        return read_manifest_bytes(root)
    key = public_key if not isinstance(public_key, (str, Path)) else load_public_key(public_key)
    sig_path, manifest_path = root / SIGNATURE, root / MANIFEST
    if not sig_path.is_file():
        raise SignatureError(
            f"{root} is not signed (no {SIGNATURE}) but a public key was given: refusing it; "
            f"sign it with `aotforge sign {root} --key PRIVATE.pem`, or load it without a key"
        )
    try:
        data = manifest_path.read_bytes()
    except OSError as e:
        raise SignatureError(f"{root} has no readable {MANIFEST} ({e.strerror}): the artifact is incomplete") from e
    record = _read_record(sig_path)
    if record["key_id"] != key_id(key):
        raise SignatureError(
            f"{SIGNATURE} of {root} was made by key {record['key_id']}, not by the given public key {key_id(key)}: "
            "verify with the signer's public key, or re-sign the artifact"
        )
    try:
        key.verify(record["signature"], data)
    except InvalidSignature:
        raise SignatureError(
            f"{MANIFEST} of {root} does not match its signature {SIGNATURE}: the manifest or the signature was "
            "modified after signing; pull or rebuild the artifact, do not load it"
        ) from None
    return data


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_bytes())
        if not isinstance(record, dict) or record.get("algorithm") != ALGORITHM:
            raise ValueError(f"algorithm is not {ALGORITHM}")
        signature = base64.b64decode(str(record["signature"]), validate=True)
        if len(signature) != 64:
            raise ValueError("an ed25519 signature is 64 bytes")
        return {"key_id": str(record["key_id"]), "signature": signature}
    except (ValueError, KeyError, TypeError) as e:
        raise SignatureError(
            f"{path.name} of {path.parent} is malformed ({e}): it was modified or truncated; "
            "pull the artifact again or re-sign it"
        ) from e


def verified_manifest(
    artifact_dir: str | Path,
    public_key: str | Path | Ed25519PublicKey | None = None,
    *,
    manifest_sha256: str | None = None,
) -> Manifest:
    """The manifest of an intact artifact: signature first (when a key is given), the manifest's own
    sha256 (when one is given: printed at build time, kept by the registry), then every file's sha256.

    The manifest parsed is the exact bytes checked, never a second read.
    """
    root = Path(artifact_dir)
    data = read_manifest_bytes(root) if public_key is None else verify_signature(root, public_key)
    if manifest_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != manifest_sha256.strip().lower():
            raise ArtifactError(
                f"{root / MANIFEST} has sha256 {actual[:12]}…, not the expected {manifest_sha256[:12]}…: the manifest "
                "was edited after the build; pull or rebuild the artifact"
            )
    try:
        manifest = manifest_from_bytes(data, root / MANIFEST)
    except ArtifactError as e:
        if public_key is None:
            raise
        raise SignatureError(f"{e} (it is signed: rebuild and re-sign it)") from e
    require_intact(root, manifest)
    return manifest
