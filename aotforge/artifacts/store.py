"""Where artifacts live on disk (``<out>/<name>/<version>/<target>/``) and how they get there atomically."""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jinja2

from aotforge.artifacts.card_plots import PLOTS_DIR, available
from aotforge.artifacts.debris import make_temp_dir, sweep
from aotforge.artifacts.hashing import hash_tree, sha256_file
from aotforge.artifacts.manifest import MANIFEST, SCHEMA_VERSION, Manifest
from aotforge.artifacts.names import check_name, check_version
from aotforge.core.errors import ArtifactError, UnknownReferenceError

MODEL_CARD = "MODEL_CARD.md"
#: The same card as one HTML page (its plots beside it under ``plots/``).
MODEL_CARD_HTML = "MODEL_CARD.html"
#: The IR the target compiled, in every artifact (and every build cache entry).
MODEL_FILE = "model.onnx"
_STAGING_PREFIX = ".staging-"
#: Versions tried by one build before giving up (each loss means another build claimed one meanwhile).
_MAX_CLAIMS = 1000


def artifact_path(out: Path, name: str, version: int, target: str) -> Path:
    return out / check_name(name) / str(check_version(version)) / check_name(target, "target")


def next_version(out: Path, name: str) -> int:
    """One past the highest version of ``name`` under ``out`` that holds an artifact (1 for a new name).

    A version directory without any ``<target>/manifest.json`` (left by a killed run) does not count.
    """
    root = out / check_name(name)
    versions = [
        int(p.name)
        for p in (root.iterdir() if root.is_dir() else ())
        if p.name.isdigit() and any(p.glob(f"*/{MANIFEST}"))
    ]
    return max(versions, default=0) + 1


@contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A temporary directory beside the final location (same filesystem: rename is atomic); removed on failure."""
    out.mkdir(parents=True, exist_ok=True)
    sweep(out, _STAGING_PREFIX)  # what killed builds left here
    path = make_temp_dir(out, _STAGING_PREFIX)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def finalize(stage: Path, manifest: Manifest, out: Path, *, explicit: bool) -> tuple[Manifest, Path]:
    """Render the model card, hash every file, write the manifest, and rename ``stage`` into place.

    The version is claimed by the rename itself (``os.rename`` refuses a non-empty destination), so
    concurrent builds of one name never collide: one that loses the race takes the next free version,
    unless the user asked for this one (``explicit``), which is then refused: a version is never
    overwritten.
    """
    drawn = sorted(p.relative_to(stage).as_posix() for p in (stage / PLOTS_DIR).glob("*.png"))
    files = hash_tree(stage)
    version = manifest.version
    for _ in range(_MAX_CLAIMS):
        claim = dataclasses.replace(manifest, version=version)
        card = render_model_card(claim, drawn)
        (stage / MODEL_CARD).write_text(card)
        (stage / MODEL_CARD_HTML).write_text(card_html(card, f"{claim.name} v{claim.version} — {claim.target.name}"))
        cards = {name: sha256_file(stage / name) for name in (MODEL_CARD, MODEL_CARD_HTML)}
        listed = {**files, **cards}
        sizes = {rel: (stage / rel).stat().st_size for rel in listed}
        claim = dataclasses.replace(claim, files=listed, file_sizes=sizes, schema_version=SCHEMA_VERSION)
        (stage / MANIFEST).write_text(claim.to_json())
        final = artifact_path(out, claim.name, version, claim.target.name)
        if _claim(stage, final):
            return claim, final
        if explicit:
            raise UnknownReferenceError(
                f"{final} already exists: version {version} of {claim.name} for {claim.target.name} "
                "was built before; give another --version or leave it out to get the next one"
            )
        version = max(version + 1, next_version(out, claim.name))
    raise ArtifactError(f"no free version of {manifest.name} under {out} after {_MAX_CLAIMS} tries: retry the build")


def _claim(stage: Path, final: Path) -> bool:
    """Rename ``stage`` to ``final``; False when another artifact is already there."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(stage, final)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise ArtifactError(
            f"cannot move the artifact into {final} ({e}): check the permissions of {final.parent}"
        ) from e
    return True


def render_model_card(manifest: Manifest, plots: list[str] | None = None) -> str:
    """MODEL_CARD.md from the manifest; ``plots`` (paths under ``plots/``) are embedded where they belong."""
    return _model_card_template().render(m=dataclasses.asdict(manifest), plots=plots or [], plots_drawn=available())


def card_html(markdown: str, title: str) -> str:
    """The card as one HTML page (CommonMark + tables, through rich's markdown-it) that opens in a browser."""
    from html import escape

    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return _HTML.format(title=escape(title), body=body)


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5rem 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: left; }}
code {{ background: #f3f3f3; padding: 0 0.2rem; }}
img {{ max-width: 100%; }}
</style></head>
<body>
{body}</body></html>
"""


@functools.cache
def _model_card_template() -> jinja2.Template:
    # Compiled once per process: parsing and compiling the template was half of a small build.
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("aotforge.artifacts", "templates"), keep_trailing_newline=True, autoescape=False
    )
    return env.get_template("MODEL_CARD.md.j2")
