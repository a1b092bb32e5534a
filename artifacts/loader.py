"""Load an artifact anywhere its target runs: verify every file first, then hand over a runner."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from artifacts.hashing import require_intact
from artifacts.manifest import Manifest, read_manifest
from compiler.errors import InputSpecError
from compiler.spec import IOSpec
from targets import get_target
from targets.base import Runner

Arrays = dict[str, np.ndarray]


class LoadedArtifact:
    """A verified artifact and its target's runner. ``run`` checks input names and dtypes first."""

    def __init__(self, path: Path, manifest: Manifest, runner: Runner) -> None:
        self.path = path
        self.manifest = manifest
        self.io = IOSpec.from_dict(manifest.io)
        self._runner = runner

    def run(self, inputs: Mapping[str, np.ndarray]) -> Arrays:
        expected = [s.name for s in self.io.inputs]
        if sorted(inputs) != sorted(expected):
            raise InputSpecError(
                f"inputs {sorted(inputs)} do not match the artifact's {expected}: pass exactly those names"
            )
        ordered = {}
        for spec in self.io.inputs:
            value = np.asarray(inputs[spec.name])
            if value.dtype != np.dtype(spec.dtype):
                raise InputSpecError(f"input {spec.name!r} is {value.dtype}, the artifact expects {spec.dtype}")
            ordered[spec.name] = value
        return self._runner.run(ordered)


def load(path: str | Path) -> LoadedArtifact:
    """Verify the artifact at ``path`` (every file's sha256) and load it for its target."""
    path = Path(path)
    manifest = read_manifest(path)
    require_intact(path, manifest)
    target = get_target(manifest.target["name"])
    runner = target.load(path, {"target": manifest.target, "io": manifest.io})
    return LoadedArtifact(path, manifest, runner)
