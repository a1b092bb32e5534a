"""Writing a signing key pair to disk, for every signature scheme aotforge makes keys for."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aotforge.core.errors import SignatureError


def write_key_pair(key: Any, private: Path, public: Path) -> tuple[Path, Path]:
    """``key`` (a ``cryptography`` private key) as PKCS#8 PEM at ``private`` and its public key at ``public``.

    Neither file may exist yet. O_EXCL + mode at creation: the private key is never readable by others,
    not even briefly.
    """
    from cryptography.hazmat.primitives import serialization

    if private.exists() or public.exists():
        raise SignatureError(
            f"{private.parent} already holds a key pair: pick another --out, or remove the old keys first"
        )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
