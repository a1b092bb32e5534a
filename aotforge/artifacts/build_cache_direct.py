"""The build cache's direct mode (as in ccache): skip the frontend when no file it read has changed.

A direct entry is ``<cache_dir>/direct/<dkey[:2]>/<dkey>.json``. Its key hashes what is known
before the frontend runs: the model file's path and bytes, the build options, the toolchain and
host (``compiler.build_direct``). It records every file the frontend and passes read, each with
size, mtime, ctime and sha256, and the IR-level cache key (``artifacts.build_cache``) the build
resolved to. That key stays the authority: a direct hit serves that entry's files, which are
verified by hash as on any hit, and a missing or corrupt one sends the build down the full path.

A file whose size, mtime and ctime all match is taken as unchanged; otherwise it is re-hashed.
A file changed within ``_RACY_NS`` of its recording could share its mtime with the recorded
version, so it is stored without a stat signature and always re-hashed (git's "racy" rule).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.manifest_shape import check_file_path

SCHEMA_VERSION = 1
DIRECT_DIR = "direct"
_RACY_NS = 2_000_000_000


@dataclasses.dataclass(frozen=True)
class FileRecord:
    """A file the build read; ``exists=False``: an open that failed, which must keep failing."""

    path: str
    size: int
    mtime_ns: int | None
    ctime_ns: int | None
    sha256: str
    exists: bool = True


@dataclasses.dataclass(frozen=True)
class DirectEntry:
    """A direct hit: the IR-level key to serve and the manifest fields the full build produced."""

    key: str
    manifest: Mapping[str, Any]
    built_at: str
    #: The model card's plots of the build that stored the entry (``plots/NAME.png`` -> PNG bytes).
    plots: Mapping[str, bytes] = dataclasses.field(default_factory=dict)


class NotCacheable(Exception):
    """A file the build read cannot be recorded (deleted, unreadable): the build gets no direct entry."""


def entry_path(cache_dir: Path, direct_key: str) -> Path:
    return Path(cache_dir) / DIRECT_DIR / direct_key[:2] / f"{direct_key}.json"


def listing_digest(directory: str) -> str | None:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    return hashlib.sha256("\0".join(names).encode()).hexdigest()


def record_file(path: str, first: tuple[int, int, int, int] | None) -> FileRecord:
    """Size, stat signature and sha256 of ``path``, whose stat when the build first read it was ``first``.

    ``NotCacheable`` if it is gone or unreadable now, or changed since it was read (its bytes now
    need not be the ones the build used).
    """
    if first is None:
        if os.path.lexists(path):
            raise NotCacheable(f"{path} did not exist when the build tried to read it, but does now")
        return FileRecord(path, -1, None, None, "", exists=False)
    try:
        before = os.stat(path)
        digest = sha256_file(Path(path))
        after = os.stat(path)
    except OSError as e:
        raise NotCacheable(f"{path} was read but cannot be hashed now ({e.strerror or e})") from e
    signature = (after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino)
    if signature != first or (before.st_mtime_ns, before.st_size) != (after.st_mtime_ns, after.st_size):
        raise NotCacheable(f"{path} changed while the build ran")
    now = time.time_ns()
    if now - after.st_mtime_ns < _RACY_NS or now - after.st_ctime_ns < _RACY_NS:
        return FileRecord(path, after.st_size, None, None, digest)
    return FileRecord(path, after.st_size, after.st_mtime_ns, after.st_ctime_ns, digest)


def file_unchanged(record: FileRecord) -> bool:
    if not record.exists:
        return not os.path.lexists(record.path)
    try:
        st = os.stat(record.path)
    except OSError:
        return False
    if st.st_size != record.size:
        return False
    if record.mtime_ns is not None and (st.st_mtime_ns, st.st_ctime_ns) == (record.mtime_ns, record.ctime_ns):
        return True
    try:
        return sha256_file(Path(record.path)) == record.sha256
    except OSError:
        return False


def store(
    cache_dir: Path,
    direct_key: str,
    components: Mapping[str, str],
    files: Sequence[FileRecord],
    listings: Mapping[str, str],
    key: str,
    manifest: Mapping[str, Any],
    built_at: str,
    plots: Mapping[str, bytes] | None = None,
) -> Path:
    """Write the entry atomically (temp file + ``os.replace``): readers see the old entry or the new one."""
    path = entry_path(cache_dir, direct_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "schema_version": SCHEMA_VERSION,
        "direct_key": direct_key,
        "components": dict(components),
        "key": key,
        "files": [dataclasses.asdict(f) for f in files],
        "listings": dict(listings),
        "manifest": dict(manifest),
        "built_at": built_at,
        # Small PNGs, kept so a direct hit serves the same card without drawing (importing matplotlib).
        "plots": {rel: base64.b64encode(data).decode() for rel, data in (plots or {}).items()},
    }
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, sort_keys=True, indent=1, default=str) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _nearest(cache_dir: Path, components: Mapping[str, str]) -> str:
    entries = []
    for path in (Path(cache_dir) / DIRECT_DIR).glob("??/*.json"):
        try:
            found = json.loads(path.read_text()).get("components")
        except (OSError, ValueError):
            continue
        if isinstance(found, dict):
            entries.append(found)
    if not entries or not components:
        return ""
    nearest = max(entries, key=lambda e: sum(e.get(c) == d for c, d in components.items()))
    differ = [c for c, d in components.items() if nearest.get(c) != d]
    return f" (nearest of {len(entries)} differs in {', '.join(differ)})"


def lookup(
    cache_dir: Path, direct_key: str, components: Mapping[str, str] | None = None
) -> tuple[DirectEntry | None, str]:
    """The entry if every file it recorded is unchanged, else None; and why, in a few words.

    Without an entry for ``direct_key``, the reason names the key ``components`` (as ``plan``
    computed them) in which the nearest entry differs.
    """
    path = entry_path(cache_dir, direct_key)
    try:
        data = json.loads(path.read_text())
        if data.get("schema_version") != SCHEMA_VERSION or data.get("direct_key") != direct_key:
            return None, "direct entry has another schema"
        files = [FileRecord(**f) for f in data["files"]]
        listings = dict(data["listings"])
        key, manifest, built_at = str(data["key"]), dict(data["manifest"]), str(data["built_at"])
        stored = data.get("plots", {})
        plots = {check_file_path(rel): base64.b64decode(b64, validate=True) for rel, b64 in stored.items()}
    except FileNotFoundError:
        return None, "no direct entry" + _nearest(cache_dir, components or {})
    except (OSError, ValueError, TypeError, KeyError) as e:
        return None, f"direct entry unreadable ({type(e).__name__})"
    for record in files:
        if not file_unchanged(record):
            return None, f"{record.path} changed"
    for directory, digest in sorted(listings.items()):
        if listing_digest(directory) != digest:
            return None, f"listing of {directory} changed"
    return DirectEntry(key, manifest, built_at, plots), "all recorded files unchanged"
