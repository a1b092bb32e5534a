"""The embedded default registry: a directory of packed artifacts (keyed by digest) plus an SQLite index.

Layout: ``<root>/index.sqlite`` and ``<root>/blobs/<digest>.tar.gz``. The digest of an artifact is the
sha256 of its ``manifest.json`` bytes (the manifest carries every file's sha256). Pushes from several
processes at once are serialised by SQLite (``BEGIN IMMEDIATE``) and a unique constraint on the digest, so
one digest never gets two versions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Protocol

from aotforge.artifacts.debris import sweep
from aotforge.artifacts.hashing import require_intact, sha256_file
from aotforge.artifacts.manifest import MANIFEST, read_manifest
from aotforge.artifacts.names import check_alias, check_name
from aotforge.artifacts.packing import PACK_PREFIX, pack, unpack
from aotforge.core.errors import ArtifactError, UnknownReferenceError

INDEX = "index.sqlite"
BLOBS = "blobs"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    blob_sha256 TEXT NOT NULL,
    target TEXT NOT NULL,
    artifact_version INTEGER NOT NULL,
    pushed_at REAL NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS aliases (
    name TEXT NOT NULL,
    alias TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (name, alias)
);
"""


@dataclasses.dataclass(frozen=True)
class RegistryEntry:
    name: str
    version: int
    digest: str
    blob_sha256: str
    target: str
    artifact_version: int
    pushed_at: float
    aliases: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


class Registry(Protocol):
    """What every registry offers (the local one here; MLflow elsewhere)."""

    def push(self, artifact_dir: str | Path) -> tuple[str, int]: ...

    def pull(self, ref: str, dest: str | Path) -> Path: ...

    def list(self) -> list[RegistryEntry]: ...

    def resolve(self, ref: str) -> RegistryEntry: ...

    def set_alias(self, name: str, alias: str, version: int) -> None: ...


def artifact_digest(artifact_dir: str | Path) -> str:
    """sha256 of the artifact's manifest bytes: it names every file's sha256, so it identifies the whole tree."""
    path = Path(artifact_dir)
    read_manifest(path)
    return hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()


def parse_ref(ref: str) -> tuple[str, int | None, str | None]:
    """``name:version`` -> (name, version, None); ``name@alias`` -> (name, None, alias)."""
    if "@" in ref:
        name, _, alias = ref.partition("@")
        if name and alias:
            return check_name(name, f"{ref!r}: the name"), None, check_alias(alias)
    elif ":" in ref:
        name, _, version = ref.rpartition(":")
        if name and version.isdigit() and int(version) >= 1:
            return check_name(name, f"{ref!r}: the name"), int(version), None
    raise UnknownReferenceError(
        f"{ref!r} is not a registry reference: write NAME:VERSION (e.g. resnet:3) or NAME@ALIAS"
    )


class LocalRegistry:
    """A registry in a local directory; safe for concurrent use by several processes on one filesystem."""

    def __init__(self, root: str | Path, *, timeout_s: float = 60.0, create: bool = True) -> None:
        """Open the registry at ``root``; with ``create=False`` one that does not exist yet is an error
        (``list --registry /typo/path`` must not make an empty registry and say it is empty)."""
        self.root = Path(root)
        self.timeout_s = timeout_s
        if not create and not (self.root / INDEX).is_file():
            raise UnknownReferenceError(
                f"there is no registry at {self.root} (no {INDEX}): check --registry, or push an artifact there first"
            )
        try:
            (self.root / BLOBS).mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise ArtifactError(f"cannot open the registry at {self.root} ({e}): check the path and permissions") from e

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.root / INDEX, timeout=self.timeout_s, isolation_level=None)) as db:
            db.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            yield db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _blob(self, digest: str) -> Path:
        return self.root / BLOBS / f"{digest}.tar.gz"

    # --- protocol -------------------------------------------------------------------------------

    def push(self, artifact_dir: str | Path) -> tuple[str, int]:
        """Store the artifact; returns (name, version). The same digest again returns its existing version."""
        src = Path(artifact_dir)
        manifest = read_manifest(src)
        require_intact(src, manifest)
        digest = artifact_digest(src)
        sweep(self.root / BLOBS, PACK_PREFIX)  # blob temp files of killed pushes
        existing = self._by_digest(digest)
        if existing is not None and self._blob(digest).is_file():
            return existing
        blob = self._blob(digest)
        pack(src, blob)  # a temp file renamed into place; racing writers write the same bytes
        blob_sha = sha256_file(blob)
        try:
            with self._transaction() as db:
                row = db.execute("SELECT name, version FROM artifacts WHERE digest = ?", (digest,)).fetchone()
                if row is not None:
                    return str(row[0]), int(row[1])
                (top,) = db.execute(
                    "SELECT COALESCE(MAX(version), 0) FROM artifacts WHERE name = ?", (manifest.name,)
                ).fetchone()
                version = int(top) + 1
                db.execute(
                    "INSERT INTO artifacts VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (manifest.name, version, digest, blob_sha, manifest.target.name, manifest.version, time.time()),
                )
                return manifest.name, version
        except sqlite3.Error as e:
            raise ArtifactError(f"the registry index {self.root / INDEX} failed ({e}): retry the push") from e

    def pull(self, ref: str, dest: str | Path) -> Path:
        """Unpack the artifact ``ref`` into ``dest`` (a new directory), verifying the blob and every file."""
        entry = self.resolve(ref)
        blob = self._blob(entry.digest)
        if not blob.is_file():
            raise ArtifactError(f"{entry.ref} is indexed but its blob {blob} is missing: push the artifact again")
        actual = sha256_file(blob)
        if actual != entry.blob_sha256:
            raise ArtifactError(
                f"{entry.ref}: blob {blob} has sha256 {actual[:12]}… but the index says {entry.blob_sha256[:12]}…: "
                "it was modified; push the artifact again"
            )
        return unpack(blob, dest, manifest_sha256=entry.digest)

    def list(self) -> list[RegistryEntry]:
        with self._connect() as db:
            aliases: dict[tuple[str, int], list[str]] = {}
            for name, alias, version in db.execute("SELECT name, alias, version FROM aliases ORDER BY alias"):
                aliases.setdefault((name, version), []).append(alias)
            rows = db.execute(
                "SELECT name, version, digest, blob_sha256, target, artifact_version, pushed_at "
                "FROM artifacts ORDER BY name, version"
            ).fetchall()
        return [
            RegistryEntry(
                name=str(r[0]),
                version=int(r[1]),
                digest=str(r[2]),
                blob_sha256=str(r[3]),
                target=str(r[4]),
                artifact_version=int(r[5]),
                pushed_at=float(r[6]),
                aliases=tuple(aliases.get((r[0], r[1]), [])),
            )
            for r in rows
        ]

    def resolve(self, ref: str) -> RegistryEntry:
        name, version, alias = parse_ref(ref)
        entries = [e for e in self.list() if e.name == name]
        if not entries:
            names = sorted({e.name for e in self.list()})
            raise UnknownReferenceError(
                f"the registry {self.root} has no artifact named {name!r}; it has: {', '.join(names) or 'nothing yet'}"
            )
        if alias is not None:
            found = [e for e in entries if alias in e.aliases]
            if not found:
                known = sorted({a for e in entries for a in e.aliases})
                raise UnknownReferenceError(
                    f"{name} has no alias {alias!r}; its aliases are: {', '.join(known) or 'none'} "
                    f"(set one with `aotforge alias {name} {alias} VERSION`)"
                )
            return found[0]
        for e in entries:
            if e.version == version:
                return e
        raise UnknownReferenceError(
            f"{name} has no version {version}; its versions are: {', '.join(str(e.version) for e in entries)}"
        )

    def set_alias(self, name: str, alias: str, version: int) -> None:
        check_name(name)
        check_alias(alias)
        self.resolve(f"{name}:{version}")
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO aliases VALUES (?, ?, ?)", (name, alias, version))

    # --- helpers --------------------------------------------------------------------------------

    def _by_digest(self, digest: str) -> tuple[str, int] | None:
        with self._connect() as db:
            row = db.execute("SELECT name, version FROM artifacts WHERE digest = ?", (digest,)).fetchone()
        return (str(row[0]), int(row[1])) if row else None
