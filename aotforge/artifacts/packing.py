"""Deterministic tarballs of artifacts for transport, and safe unpacking that verifies every file."""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from aotforge.artifacts.debris import make_temp_dir, make_temp_file, sweep
from aotforge.artifacts.hashing import require_intact, sha256_file
from aotforge.artifacts.manifest import MANIFEST, read_manifest
from aotforge.core.errors import ArtifactError, UnknownReferenceError

_FILE_MODE = 0o644
_DIR_MODE = 0o755
#: Temporaries (``artifacts.debris``): a tarball being written, an artifact being unpacked.
PACK_PREFIX = ".pack-"
UNPACK_PREFIX = ".unpack-"


def _entries(root: Path) -> list[Path]:
    entries = []
    for p in sorted(root.rglob("*"), key=lambda q: q.relative_to(root).as_posix()):
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            raise ArtifactError(f"{p} is a link or special file: an artifact holds only plain files; rebuild it")
        entries.append(p)
    return entries


def _info(name: str, *, is_dir: bool, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = _DIR_MODE if is_dir else _FILE_MODE
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(artifact_dir: str | Path, tar_path: str | Path) -> Path:
    """Write ``artifact_dir`` as a gzipped tarball whose bytes depend only on the files' paths and contents."""
    root = Path(artifact_dir)
    read_manifest(root)  # refuse to pack something that is not an artifact
    out = Path(tar_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep(out.parent, PACK_PREFIX)
    tmp = make_temp_file(out.parent, PACK_PREFIX)
    try:
        with tmp.open("wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for p in _entries(root):
                        rel = p.relative_to(root).as_posix()
                        if p.is_dir():
                            tar.addfile(_info(rel, is_dir=True))
                        else:
                            with p.open("rb") as f:
                                tar.addfile(_info(rel, is_dir=False, size=p.stat().st_size), f)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _safe_name(name: str, tar_path: Path) -> PurePosixPath:
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or name.startswith(("/", "\\")) or ".." in rel.parts or "\\" in name:
        raise ArtifactError(
            f"{tar_path} holds the entry {name!r}, which points outside the artifact: refusing to unpack it; "
            "the tarball is corrupt or malicious, get it again from its source"
        )
    return rel


def unpack(tar_path: str | Path, dest: str | Path, *, manifest_sha256: str | None = None) -> Path:
    """Unpack a tarball made by :func:`pack` into ``dest`` (which must not exist), atomically and verified.

    Absolute paths, ``..``, links and device files are rejected; every file's sha256 is checked against the
    manifest before ``dest`` appears, and so is the manifest's own sha256 when ``manifest_sha256`` is given
    (a registry's digest): a tarball that fails any check leaves nothing at ``dest``.
    """
    src = Path(tar_path)
    final = Path(dest)
    if final.exists():
        raise UnknownReferenceError(f"{final} already exists: unpack into a new directory or remove it first")
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep(final.parent, UNPACK_PREFIX)  # what killed pulls left beside --dest
    stage = make_temp_dir(final.parent, UNPACK_PREFIX)
    try:
        try:
            tar = tarfile.open(src, mode="r:gz")
        except (OSError, tarfile.TarError) as e:
            raise ArtifactError(f"{src} is not a readable artifact tarball ({e}): get it again") from e
        with tar:
            for member in tar:
                rel = _safe_name(member.name, src)
                target = stage.joinpath(*rel.parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isreg():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    f = tar.extractfile(member)
                    if f is None:
                        raise ArtifactError(f"{src}: entry {member.name!r} has no data: the tarball is corrupt")
                    with f, target.open("xb") as out:
                        shutil.copyfileobj(f, out)
                    target.chmod(_FILE_MODE)
                else:
                    kind = "link" if member.issym() or member.islnk() else "device or special file"
                    raise ArtifactError(
                        f"{src} holds {member.name!r}, a {kind}: artifacts hold only plain files; refusing to "
                        "unpack it, the tarball is corrupt or malicious"
                    )
        if not (stage / MANIFEST).is_file():
            raise ArtifactError(f"{src} has no {MANIFEST}: it is not an aotforge artifact tarball")
        require_intact(stage, read_manifest(stage))
        if manifest_sha256 is not None and sha256_file(stage / MANIFEST) != manifest_sha256:
            raise ArtifactError(
                f"{src}: its manifest's sha256 is not the expected {manifest_sha256[:12]}…: the artifact was "
                "modified after it was published; push it again from a good copy"
            )
        os.rename(stage, final)
    except (OSError, EOFError, tarfile.TarError) as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise ArtifactError(f"could not unpack {src} into {final} ({e}): check the path and free space") from e
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return final
