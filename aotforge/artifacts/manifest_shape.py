"""The shape a manifest's JSON must have before anything reads a field of it.

A manifest is a file someone else may have written (or flipped a byte of): a list, ``null``, JSON
nested 100k deep, ``files`` as a list or ``target.name`` as a list must each be one clear
:class:`ArtifactError`, not a ``TypeError`` / ``KeyError`` / ``RecursionError`` somewhere later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from aotforge.artifacts.names import check_name, check_version
from aotforge.core.errors import AotforgeError, ArtifactError
from aotforge.core.spec import IOSpec

#: Far deeper than any manifest aotforge writes (~6), far shallower than Python's recursion limit.
MAX_DEPTH = 64
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: The JSON type each top-level field must have.
_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "version": int,
    "target": dict,
    "toolchain": dict,
    "source": dict,
    "ir": dict,
    "passes": list,
    "io": dict,
    "validation": dict,
    "benchmark": (dict, type(None)),
    "files": dict,
    "build": dict,
    "schema_version": int,
}


def parse_json(raw: bytes) -> Any:
    """JSON from bytes, refusing nesting deeper than :data:`MAX_DEPTH` before the parser recurses."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ArtifactError(f"the manifest is not UTF-8 text ({e}): it is corrupt; rebuild the artifact") from e
    if _depth(text) > MAX_DEPTH:
        raise ArtifactError(f"the manifest nests deeper than {MAX_DEPTH} levels: it is corrupt; rebuild the artifact")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ArtifactError(f"the manifest is not valid JSON ({e}): it is corrupt; rebuild the artifact") from e


def _depth(text: str) -> int:
    """The deepest bracket nesting outside strings (a quick scan; json.loads checks the rest)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def check_shape(data: Mapping[str, Any]) -> None:
    """Every field of the expected JSON type, a safe name and version, and ``files`` safe paths to digests."""
    for field, expected in _TYPES.items():
        value = data[field]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ArtifactError(
                f"manifest field {field!r} is a JSON {type(value).__name__}, not what aotforge writes: "
                "the manifest is corrupt; rebuild the artifact"
            )
    try:
        check_name(data["name"], "manifest name")
        check_version(data["version"], "manifest version")
        check_name(data["target"].get("name"), "manifest target.name")
    except ArtifactError as e:
        raise ArtifactError(f"{e}; the manifest is corrupt, rebuild the artifact") from e
    for key in ("options", "info"):
        if not isinstance(data["target"].get(key, {}), dict):
            raise ArtifactError(f"manifest target.{key} is not an object: the manifest is corrupt; rebuild it")
    if not all(isinstance(p, dict) for p in data["passes"]):
        raise ArtifactError("manifest passes are not all objects: the manifest is corrupt; rebuild it")
    for rel, digest in data["files"].items():
        check_file_path(rel)
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ArtifactError(f"manifest files[{rel!r}] is not a sha256 hex digest: the manifest is corrupt")
    if "file_sizes" in data:
        _check_sizes(data["file_sizes"], data["files"])
    _check_io(data["io"])


def _check_sizes(sizes: Any, files: Mapping[str, Any]) -> None:
    """Schema 2: one non-negative byte count per listed file, no more, no fewer."""
    if not isinstance(sizes, dict) or set(sizes) != set(files):
        raise ArtifactError("manifest file_sizes does not list exactly the manifest's files: it is corrupt; rebuild it")
    for rel, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ArtifactError(f"manifest file_sizes[{rel!r}] is not a byte count: the manifest is corrupt")


def check_file_path(rel: Any) -> str:
    """A relative POSIX path inside the artifact: no ``..``, no absolute path, no empty or hidden trick parts."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in rel or "\0" in rel:
        raise ArtifactError(f"manifest lists file {rel!r}, which is not a path inside the artifact: it is corrupt")
    return rel


def _check_io(io: Mapping[str, Any]) -> None:
    try:
        spec = IOSpec.from_dict(io)
        for tensor in (*spec.inputs, *spec.outputs):
            np.dtype(tensor.dtype)  # the loader checks inputs against it
            if not all(isinstance(d, (int, str)) and not isinstance(d, bool) for d in tensor.shape):
                raise ValueError(f"{tensor.name}: shape {list(tensor.shape)} is not ints and dim names")
    except (AotforgeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"manifest io is malformed ({e!r}): the manifest is corrupt; rebuild the artifact") from e
