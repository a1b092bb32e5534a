"""A content-addressed cache of target compiles, shared safely by concurrent builds.

The key is the sha256 of its components: the canonical IR after passes (the bytes of the staged
``model.onnx``; a text-generation build's graphs and their weights), the pass list with parameters,
the target and its options, the I/O spec the target compiles for, and the toolchain versions. Each
component's own sha256 is stored with the entry, so a miss can say which component differs from
the nearest entry. An entry is
``<cache_dir>/<key[:2]>/<key>/``: the target's compiled files, the ``model.onnx`` they were
compiled from (so a direct hit, ``artifacts.build_cache_direct``, can serve a whole artifact
without running the frontend) and ``entry.json``, which carries
every file's sha256; an entry that fails those hashes, or whose JSON cannot be read, is deleted and
treated as a miss, never served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file

SCHEMA_VERSION = 1
ENTRY_JSON = "entry.json"
_TMP_PREFIX = ".tmp-"

#: Key components in a fixed order; ``explain`` names them with these words.
COMPONENTS = ("ir", "passes", "target", "io", "toolchain")


@dataclasses.dataclass(frozen=True)
class CachedCompile:
    """What a hit gives back in place of ``target.compile``'s ``CompileResult``."""

    files: tuple[str, ...]
    target_info: Mapping[str, Any]
    toolchain: Mapping[str, str]
    #: Files of the stage the compile removed (tvm's decoder repacks ``weights.data`` into a file of its own):
    #: a hit removes them too, so the artifact holds what the compile left.
    removed: tuple[str, ...] = ()


def _digest_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def key_components(
    ir_files: Path | Sequence[Path],
    passes: Sequence[Mapping[str, Any]],
    target: str,
    target_options: Mapping[str, Any],
    io: Mapping[str, Any],
    toolchain: Mapping[str, str],
) -> dict[str, str]:
    """sha256 of each key component, by name (see ``COMPONENTS``).

    ``ir_files``: the staged IR, or (text generation) its graphs and their weights, each digest under its name;
    one file keys as its own sha256, so entries stored before graphs came in several files still hit."""
    files = [ir_files] if isinstance(ir_files, Path) else list(ir_files)
    ir_digest = sha256_file(files[0]) if len(files) == 1 else _digest_json([[f.name, sha256_file(f)] for f in files])
    return {
        "ir": ir_digest,
        "passes": _digest_json(list(passes)),
        "target": _digest_json({"name": target, "options": dict(target_options)}),
        "io": _digest_json(dict(io)),
        "toolchain": _digest_json(dict(toolchain)),
    }


def cache_key(components: Mapping[str, str]) -> str:
    """The entry key: sha256 over the named component digests, in ``COMPONENTS`` order."""
    missing = [c for c in COMPONENTS if c not in components]
    if missing:
        raise ValueError(f"cache key components missing: {', '.join(missing)}")
    return _digest_json([[c, components[c]] for c in COMPONENTS])


def entry_dir(cache_dir: Path, key: str) -> Path:
    return cache_dir / key[:2] / key


def _read_entry(path: Path) -> dict[str, Any] | None:
    """The entry's JSON if it parses and has the expected shape, else None."""
    try:
        data = json.loads((path / ENTRY_JSON).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        return None
    if not isinstance(data.get("files"), dict) or not isinstance(data.get("components"), dict):
        return None
    return data


def _safe(rel: str) -> bool:
    return ".." not in Path(rel).parts and not Path(rel).is_absolute()


def _copy_hashed(src: Path, dest: Path) -> str:
    """Copy ``src`` to ``dest`` and return the sha256 of the bytes copied: one read checks entry and copy."""
    digest = hashlib.sha256()
    with src.open("rb") as fin, dest.open("wb") as fout:
        for block in iter(lambda: fin.read(1 << 20), b""):
            digest.update(block)
            fout.write(block)
    return digest.hexdigest()


def _discard(path: Path) -> None:
    """Move ``path`` aside atomically, then delete it, so no reader sees a half-deleted entry."""
    trash = path.parent / f"{_TMP_PREFIX}del-{path.name}-{os.getpid()}-{id(path)}"
    try:
        os.rename(path, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def lookup(cache_dir: Path, key: str, stage: Path, staged: Collection[str] = ()) -> CachedCompile | None:
    """On a hit, copy the entry's files into ``stage`` and return them; a corrupt entry is deleted.

    ``staged`` names files the caller already holds in ``stage`` with the entry's bytes (the IR
    the key was computed from): they are neither copied nor removed.
    """
    path = entry_dir(cache_dir, key)
    if not path.is_dir():
        return None
    data = _read_entry(path)
    intact = data is not None and all(_safe(rel) and (path / rel).is_file() for rel in data["files"])
    if data is not None and intact:
        for rel, digest in data["files"].items():
            if rel in staged:
                continue
            dest = stage / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                # The copy's hash is the entry's: a file changed or truncated while we copy fails too.
                intact = _copy_hashed(path / rel, dest) == digest
            except OSError:
                intact = False
            if not intact:
                break
    if data is None or not intact:
        for rel in data["files"] if data is not None else ():
            if _safe(rel) and rel not in staged:
                (stage / rel).unlink(missing_ok=True)
        _discard(path)
        return None
    return CachedCompile(
        files=tuple(data["files"]),
        target_info=data.get("target_info", {}),
        toolchain=data.get("toolchain", {}),
        removed=tuple(rel for rel in data.get("removed", ()) if _safe(rel)),
    )


def entry_files(cache_dir: Path, key: str) -> set[str]:
    """The files an entry holds (unverified), e.g. to know whether it predates storing ``model.onnx``."""
    data = _read_entry(entry_dir(cache_dir, key))
    return set(data["files"]) if data is not None else set()


def store(
    cache_dir: Path,
    key: str,
    components: Mapping[str, str],
    stage: Path,
    files: Sequence[str],
    target_info: Mapping[str, Any],
    toolchain: Mapping[str, str],
    removed: Sequence[str] = (),
) -> Path:
    """Copy ``files`` from ``stage`` into a new entry; a concurrent writer of the same key wins quietly.

    ``removed``: staged files the compile deleted, which a hit deletes too (``CachedCompile.removed``)."""
    final = entry_dir(cache_dir, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=final.parent))
    try:
        hashes = {}
        for rel in sorted(files):
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(stage / rel, dest)
            hashes[rel] = sha256_file(dest)
        entry = {
            "schema_version": SCHEMA_VERSION,
            "key": key,
            "components": dict(components),
            "target_info": dict(target_info),
            "toolchain": dict(toolchain),
            "files": hashes,
            **({"removed": sorted(removed)} if removed else {}),
        }
        (tmp / ENTRY_JSON).write_text(json.dumps(entry, sort_keys=True, indent=2, default=str) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            pass  # another build stored this key first: keep theirs, discard ours
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _entries(cache_dir: Path) -> list[tuple[str, dict[str, str]]]:
    found: list[tuple[str, dict[str, str]]] = []
    if not cache_dir.is_dir():
        return found
    for path in sorted(cache_dir.glob("??/*")):
        if path.name.startswith(_TMP_PREFIX) or not path.is_dir():
            continue
        data = _read_entry(path)
        if data is not None:
            found.append((path.name, {str(k): str(v) for k, v in data["components"].items()}))
    return found


def explain(cache_dir: Path, components: Mapping[str, str]) -> str:
    """Which key components differ from the nearest entry (the one sharing most components)."""
    entries = _entries(Path(cache_dir))
    if not entries:
        return f"cache {cache_dir} is empty"
    key = cache_key(components)

    def shared(item: tuple[str, dict[str, str]]) -> int:
        return sum(item[1].get(c) == components.get(c) for c in COMPONENTS)

    nearest_key, nearest = max(entries, key=shared)
    differ = [c for c in COMPONENTS if nearest.get(c) != components.get(c)]
    if not differ:
        return f"entry {key[:12]} matches on every component"
    return (
        f"nearest of {len(entries)} cached entr{'y' if len(entries) == 1 else 'ies'} is {nearest_key[:12]}; "
        f"differs in {', '.join(differ)}"
    )
