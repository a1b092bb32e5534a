"""The artifact manifest: a frozen, schema-versioned record written as sorted-key JSON."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotforge.artifacts.manifest_shape import check_shape, parse_json
from aotforge.core.errors import ArtifactError
from aotforge.core.target_record import TargetRecord

#: 1: the first artifacts. The JSON of ``target`` ({name, options, info}) did not change when it
#: became a typed :class:`TargetRecord`. 2: ``file_sizes`` (bytes of each listed file), which bound
#: what unpacking a tarball may write. Schema 1 manifests still read (and write back byte for byte).
SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
MANIFEST = "manifest.json"


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything DESIGN.md lists. ``build`` holds the only fields that differ between identical builds."""

    name: str
    version: int
    target: TargetRecord
    toolchain: dict[str, str]
    source: dict[str, Any]
    ir: dict[str, Any]
    passes: list[dict[str, Any]]
    io: dict[str, Any]
    validation: dict[str, Any]
    benchmark: dict[str, Any] | None
    files: dict[str, str]
    build: dict[str, Any]
    #: Bytes of each file of ``files`` (schema 2; empty in a schema 1 manifest, which has no sizes).
    file_sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain JSON values (the target record included), in its own schema's fields."""
        data = dataclasses.asdict(self)
        if self.schema_version == 1:
            data.pop("file_sizes")
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=2) + "\n"

    def reproducible_part(self) -> dict[str, Any]:
        """The manifest without ``build`` (timestamps, host, durations)."""
        data = self.to_dict()
        data.pop("build")
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """A manifest from parsed JSON; anything of the wrong shape is one :class:`ArtifactError`, never a crash."""
        if not isinstance(data, Mapping):
            raise ArtifactError(f"manifest is a JSON {type(data).__name__}, not an object: it is corrupt; rebuild it")
        schema = data.get("schema_version")
        if isinstance(schema, bool) or schema not in READABLE_SCHEMAS:
            raise ArtifactError(
                f"manifest schema_version {schema!r} is not one of {', '.join(map(str, READABLE_SCHEMAS))}: "
                "this aotforge cannot read it; rebuild the artifact or use a matching aotforge"
            )
        fields = {f.name for f in dataclasses.fields(cls)} - ({"file_sizes"} if schema == 1 else set())
        unknown = set(data) - fields
        missing = fields - set(data)
        if unknown or missing:
            raise ArtifactError(f"manifest has unknown keys {sorted(unknown)} / lacks {sorted(missing)}: it is corrupt")
        check_shape(data)
        return cls(**{**data, "target": TargetRecord.from_dict(data["target"])})


def read_manifest(artifact_dir: Path) -> Manifest:
    return manifest_from_bytes(read_manifest_bytes(artifact_dir), artifact_dir / MANIFEST)


def read_manifest_bytes(artifact_dir: Path) -> bytes:
    """The manifest's exact bytes (what its sha256 and a signature cover); a link is refused."""
    path = artifact_dir / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise ArtifactError(f"{artifact_dir} is not an aotforge artifact: it has no {MANIFEST} (or it is a link)")
    try:
        return path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path} is not readable ({e}): check its permissions") from e


def manifest_from_bytes(raw: bytes, where: Path | str) -> Manifest:
    try:
        return Manifest.from_dict(parse_json(raw))
    except ArtifactError as e:
        raise ArtifactError(f"{where}: {e}") from e
