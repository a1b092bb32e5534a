"""What a build returns: where the artifact (or bundle) is and its manifest."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from aotforge.artifacts.manifest import Manifest


@dataclasses.dataclass(frozen=True)
class BuildResult:
    path: Path
    #: For a ``prepare_only`` build, ``path`` is a bundle and this the manifest draft (validation pending).
    manifest: Manifest
