"""The build-bundle format both kinds of bundle share (``compiler.bundle``, ``compiler.generative.bundled``).

A bundle is a directory with ``bundle.json`` (its format version, the description of the build, the sha256 of
every other file, and a digest over all of that) beside the files it names. Reading one checks all of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import hash_tree, sha256_file
from aotforge.compiler.build_tail import ArtifactPlace, TailJob, TailWork
from aotforge.compiler.isolation import Isolation
from aotforge.core.errors import ArtifactError

BUNDLE_FORMAT = 1
BUNDLE_JSON = "bundle.json"
VALIDATION_NPZ = "validation.npz"


def bundle_path(out: Path, name: str, target: str) -> Path:
    return out / "bundles" / f"{name}.{target}.bundle"


def read_bundle(path: Path) -> dict[str, Any]:
    """The bundle's description after checking its format version, its own digest and every file's hash."""
    meta = path / BUNDLE_JSON
    if not meta.is_file():
        raise ArtifactError(
            f"{path} is not a build bundle (no {BUNDLE_JSON}): give a directory written by --prepare-only"
        )
    try:
        data = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{meta} is not valid JSON ({e}): prepare the bundle again") from e
    if data.get("format_version") != BUNDLE_FORMAT:
        raise ArtifactError(
            f"{path} has bundle format {data.get('format_version')!r}, this aotforge reads {BUNDLE_FORMAT}: "
            "prepare it again with this aotforge version"
        )
    claimed = data.pop("bundle_sha256", None)
    if claimed != json_digest(data):
        raise ArtifactError(f"{meta} was modified after it was written (digest mismatch): prepare the bundle again")
    actual = hash_tree(path)
    actual.pop(BUNDLE_JSON, None)
    expected = data["files"]
    bad = sorted(n for n in set(expected) | set(actual) if expected.get(n) != actual.get(n))
    if bad:
        raise ArtifactError(
            f"{path}: {', '.join(bad)} missing, added or changed since the bundle was prepared: prepare it again"
        )
    return dict(data)


def write_bundle_json(directory: Path, body: Mapping[str, Any]) -> None:
    """``bundle.json``: ``body`` as sorted-key JSON with its own digest (``bundle_sha256``), which reading checks."""
    (directory / BUNDLE_JSON).write_text(json_text({**body, "bundle_sha256": json_digest(body)}))


def json_values(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples become lists, other objects their ``str``): what a reader compares."""
    return json.loads(json.dumps(value, default=str))


def json_text(data: Mapping[str, Any]) -> str:
    """Sorted-key, indented JSON with a final newline (the same data always gives the same bytes)."""
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def json_digest(data: Mapping[str, Any]) -> str:
    """The sha256 of ``data``'s sorted-key JSON."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def seal_bundle(stage: Path, body: Mapping[str, Any], final: Path) -> dict[str, Any]:
    """``body`` with the host it was prepared on and the hash of every file in ``stage``, written as the stage's
    ``bundle.json``; the stage then renamed to ``final``. Returns the body written."""
    sealed = {
        **body,
        "prepared": {"host": socket.gethostname(), "machine": platform.machine()},
        "files": hash_tree(stage),
    }
    write_bundle_json(stage, sealed)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.rename(stage, final)
    return sealed


def finish_job(
    path: Path,
    data: Mapping[str, Any],
    place: ArtifactPlace,
    target: Any,
    target_options: Any,
    work: TailWork,
    toolchain: Mapping[str, str],
    *,
    cache_dir: Path | None,
    worker: Mapping[str, Any] | None,
    isolation: Isolation | None,
    build_extra: Mapping[str, Any] | None = None,
) -> TailJob:
    """The build tail's job that finishes the bundle at ``path`` (``data``: its checked ``bundle.json``): the source
    and passes of its draft; the manifest's ``build`` section names the bundle (its digest, where it was prepared)
    and the worker that finished it."""
    draft = data["manifest_draft"]
    return TailJob(
        place=place,
        target=target,
        target_options=target_options,
        work=work,
        source=draft["source"],
        passes=draft["passes"],
        toolchain=toolchain,
        cache_dir=cache_dir,
        build_extra={
            **(build_extra or {}),
            "bundle": {"sha256": sha256_file(path / BUNDLE_JSON), "prepared": data["prepared"]},
            **({"worker": dict(worker)} if worker else {}),
        },
        isolation=isolation or Isolation(),
    )
