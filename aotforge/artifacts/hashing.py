"""Content hashes of artifact files, and their verification."""

from __future__ import annotations

import hashlib
from pathlib import Path

from aotforge.artifacts.manifest import MANIFEST, Manifest
from aotforge.core.errors import ArtifactError

#: The detached signature over ``manifest.json``'s bytes (``artifacts.signing``). Like the manifest it
#: is not listed in the manifest's files (it cannot hash itself), but it travels in every tarball.
SIGNATURE = "manifest.sig"
#: The OpenSSF model-signing bundle over every file (``artifacts.openssf_signing``): unlisted, like the signature.
BUNDLE = "model.sig"
_UNLISTED = (MANIFEST, SIGNATURE, BUNDLE)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_tree(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except the top-level manifest and signature, by sorted POSIX path."""
    return {
        rel: sha256_file(p)
        for p in sorted(root.rglob("*"))
        if not p.is_symlink() and p.is_file() and (rel := p.relative_to(root).as_posix()) not in _UNLISTED
    }


def irregular_entries(root: Path) -> list[str]:
    """Links and special files under ``root``: an artifact holds only plain files and directories
    (a link to a file outside would otherwise pass its hash check and be loaded)."""
    return [
        p.relative_to(root).as_posix()
        for p in sorted(root.rglob("*"))
        if p.is_symlink() or not (p.is_file() or p.is_dir())
    ]


def verify_files(artifact_dir: Path, manifest: Manifest) -> list[str]:
    """Problems found: files changed, missing, or present but not in the manifest. Empty when intact."""
    actual = hash_tree(artifact_dir)
    problems = [f"{rel}: a link or special file, not a plain file" for rel in irregular_entries(artifact_dir)]
    for rel, digest in sorted(manifest.files.items()):
        if rel not in actual:
            problems.append(f"{rel}: missing")
        elif actual[rel] != digest:
            problems.append(f"{rel}: sha256 {actual[rel][:12]}… != manifest {digest[:12]}…")
        elif (size := (artifact_dir / rel).stat().st_size) != manifest.file_sizes.get(rel, size):
            problems.append(f"{rel}: {size} bytes != manifest {manifest.file_sizes[rel]}")
    problems += [f"{rel}: not listed in the manifest" for rel in sorted(set(actual) - set(manifest.files))]
    return problems


def require_intact(artifact_dir: Path, manifest: Manifest) -> None:
    problems = verify_files(artifact_dir, manifest)
    if problems:
        raise ArtifactError(
            f"artifact {artifact_dir} failed verification ({'; '.join(problems)}): it was modified or is incomplete; "
            "rebuild or pull it again"
        )
