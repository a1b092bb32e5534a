"""Deterministic tarballs of artifacts for transport, and safe unpacking that verifies every file."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from aotforge.artifacts.debris import make_temp_dir, make_temp_file, sweep
from aotforge.artifacts.hashing import BUNDLE, SIGNATURE, require_intact
from aotforge.artifacts.manifest import MANIFEST, Manifest, manifest_from_bytes, read_manifest
from aotforge.core.errors import ArtifactError, UnknownReferenceError

_FILE_MODE = 0o644
_DIR_MODE = 0o755
#: Temporaries (``artifacts.debris``): a tarball being written, an artifact being unpacked.
PACK_PREFIX = ".pack-"
UNPACK_PREFIX = ".unpack-"
#: A manifest or signature larger than this is not one aotforge wrote (they are KiBs).
MAX_MANIFEST_BYTES = 16 << 20


def _entries(root: Path) -> list[Path]:
    entries = []
    for p in sorted(root.rglob("*"), key=lambda q: q.relative_to(root).as_posix()):
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            raise ArtifactError(f"{p} is a link or special file: an artifact holds only plain files; rebuild it")
        entries.append(p)
    return entries


def _in_pack_order(root: Path) -> list[Path]:
    """The manifest first (unpacking reads it before any other entry: the sizes it declares bound
    the rest), then every entry by path."""
    entries = _entries(root)
    return sorted(entries, key=lambda p: p.relative_to(root).as_posix() != MANIFEST)


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
                    for p in _in_pack_order(root):
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

    Absolute paths, ``..``, links and device files are rejected. The manifest is read first (and its
    sha256 checked when ``manifest_sha256`` is given: a registry's digest), then every other entry
    must be a file it lists, of the size it declares (schema 2), before a byte of it is written: a
    decompression bomb is refused, not written out. Every file's sha256 is checked before ``dest``
    appears: a tarball that fails any check leaves nothing at ``dest``.
    """
    src = Path(tar_path)
    final = Path(dest)
    if final.exists():
        raise UnknownReferenceError(f"{final} already exists: unpack into a new directory or remove it first")
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep(final.parent, UNPACK_PREFIX)  # what killed pulls left beside --dest
    stage = make_temp_dir(final.parent, UNPACK_PREFIX)
    try:
        raw = _manifest_bytes(src)
        if manifest_sha256 is not None and hashlib.sha256(raw).hexdigest() != manifest_sha256:
            raise ArtifactError(
                f"{src}: its manifest's sha256 is not the expected {manifest_sha256[:12]}…: the artifact was "
                "modified after it was published; push it again from a good copy"
            )
        manifest = manifest_from_bytes(raw, f"{src}:{MANIFEST}")
        with _open(src) as tar:
            for member in tar:
                _extract(tar, member, stage, _bound(manifest, member, src), src)
        require_intact(stage, read_manifest(stage))
        os.rename(stage, final)
    except (OSError, EOFError, tarfile.TarError, zlib.error) as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise ArtifactError(f"could not unpack {src} into {final} ({e}): check the path and free space") from e
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return final


def _open(src: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(src, mode="r:gz")
    except (OSError, tarfile.TarError) as e:
        raise ArtifactError(f"{src} is not a readable artifact tarball ({e}): get it again") from e


def _manifest_bytes(src: Path) -> bytes:
    """The manifest's bytes, found by reading the entries' headers (pack writes it first); no other data is written."""
    with _open(src) as tar:
        for member in tar:
            _safe_name(member.name, src)  # entries before it: checked, not written
            if not (member.isreg() or member.isdir()):
                raise _irregular(member, src)
            if member.name == MANIFEST:
                if member.size > MAX_MANIFEST_BYTES:
                    raise ArtifactError(
                        f"{src}: its {MANIFEST} declares {member.size} bytes, over {MAX_MANIFEST_BYTES}: the tarball "
                        "is corrupt or malicious"
                    )
                f = tar.extractfile(member)
                if f is not None:
                    with f:
                        return f.read()
    raise ArtifactError(f"{src} has no {MANIFEST}: it is not an aotforge artifact tarball")


def _bound(manifest: Manifest, member: tarfile.TarInfo, src: Path) -> int | None:
    """The bytes ``member`` may hold: what the manifest declares (None: a schema 1 manifest declares no sizes)."""
    rel = _safe_name(member.name, src).as_posix()
    if member.isdir():
        return 0
    if rel in (MANIFEST, SIGNATURE, BUNDLE):  # not listed: they cannot hash themselves
        if member.size > MAX_MANIFEST_BYTES:
            raise ArtifactError(
                f"{src}: {member.name!r} declares {member.size} bytes: the tarball is corrupt or malicious"
            )
        return MAX_MANIFEST_BYTES
    if rel not in manifest.files:
        raise ArtifactError(
            f"{src} holds {member.name!r}, a file its manifest does not list: refusing to unpack it; the tarball is "
            "corrupt or malicious, get it again from its source"
        )
    limit = manifest.file_sizes.get(rel)
    if limit is not None and member.isreg() and member.size != limit:
        raise ArtifactError(
            f"{src}: {member.name!r} holds {member.size} bytes where its manifest declares {limit}: refusing to "
            "unpack it (a decompression bomb, or a corrupt tarball); get it again from its source"
        )
    return limit


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, stage: Path, limit: int | None, src: Path) -> None:
    target = stage.joinpath(*_safe_name(member.name, src).parts)
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
        raise _irregular(member, src)


def _irregular(member: tarfile.TarInfo, src: Path) -> ArtifactError:
    kind = "link" if member.issym() or member.islnk() else "device or special file"
    return ArtifactError(
        f"{src} holds {member.name!r}, a {kind}: artifacts hold only plain files; refusing to "
        "unpack it, the tarball is corrupt or malicious"
    )
