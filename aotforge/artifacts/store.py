"""Where artifacts live on disk (``<out>/<name>/<version>/<target>/``) and how they get there atomically."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jinja2

from aotforge.artifacts.hashing import hash_tree
from aotforge.artifacts.manifest import MANIFEST, Manifest
from aotforge.core.errors import ArtifactError

MODEL_CARD = "MODEL_CARD.md"
#: The IR the target compiled, in every artifact (and every build cache entry).
MODEL_FILE = "model.onnx"
_STAGING_PREFIX = ".staging-"


def artifact_path(out: Path, name: str, version: int, target: str) -> Path:
    return out / name / str(version) / target


def next_version(out: Path, name: str) -> int:
    """One past the highest existing version of ``name`` under ``out`` (1 for a new name)."""
    root = out / name
    versions = [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []
    return max(versions, default=0) + 1


@contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A temporary directory beside the final location (same filesystem: rename is atomic); removed on failure."""
    out.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=out))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def finalize(stage: Path, manifest: Manifest, final: Path) -> Manifest:
    """Render the model card, hash every file, write the manifest, and rename ``stage`` to ``final``."""
    (stage / MODEL_CARD).write_text(render_model_card(manifest))
    manifest = dataclasses.replace(manifest, files=hash_tree(stage))
    (stage / MANIFEST).write_text(manifest.to_json())
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        # os.rename refuses a non-empty destination: a version is never overwritten, even by a race.
        os.rename(stage, final)
    except OSError as e:
        raise ArtifactError(
            f"{final} already exists: version {manifest.version} of {manifest.name} for {manifest.target.name} "
            "was built before; give another --version or leave it out to get the next one"
        ) from e
    return manifest


def render_model_card(manifest: Manifest) -> str:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("aotforge.artifacts", "templates"), keep_trailing_newline=True, autoescape=False
    )
    return env.get_template("MODEL_CARD.md.j2").render(m=dataclasses.asdict(manifest))
