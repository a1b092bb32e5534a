"""Concurrent compiles into one --out: every build succeeds, each with its own version.

Before, the version was chosen before the compile: 4 of 12 concurrent builds of one model failed at
the end with ".../1/onnxruntime already exists". The rename into place now claims the version.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from aotforge.core.errors import AotforgeError
from tests.tiny_models import relu_add

BUILDS = 6


_BARRIER: Any = None


def _hold(barrier: Any) -> None:
    """A pool worker's initializer: the barrier every build waits at, so the builds start together."""
    global _BARRIER
    _BARRIER = barrier


def _build(args: tuple[str, str]) -> tuple[str, int] | str:
    from tests.conftest import quick_build

    model, out = args
    _BARRIER.wait()
    try:
        result = quick_build(model, Path(out), target="onnxruntime", validation_samples=1)
    except AotforgeError as e:
        return f"error: {e}"
    return str(result.path), result.manifest.version


def test_concurrent_compiles_into_one_out_all_get_distinct_versions(tmp_path: Path) -> None:
    model = str(relu_add(tmp_path / "m.onnx"))
    out = tmp_path / "out"
    # Spawned, not forked: a fork of the test process (its threads: xdist's, tqdm's, the runtimes' pools) can
    # inherit a lock another thread held and hang the build that needs it.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(BUILDS, initializer=_hold, initargs=(ctx.Barrier(BUILDS),)) as pool:
        results = pool.map(_build, [(model, str(out))] * BUILDS)
    errors = [r for r in results if isinstance(r, str)]
    assert not errors, errors
    versions = sorted(v for _, v in results)  # type: ignore[misc]
    assert versions == list(range(1, BUILDS + 1))
    for path, version in results:  # type: ignore[misc]
        manifest = json.loads((Path(path) / "manifest.json").read_text())
        assert manifest["version"] == version and Path(path).parent.name == str(version)
        assert f"v{version} " in (Path(path) / "MODEL_CARD.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["m"]  # no staging directory left behind


def test_an_explicit_existing_version_is_still_refused(tmp_path: Path) -> None:
    from tests.conftest import quick_build

    model = str(relu_add(tmp_path / "m.onnx"))
    quick_build(model, tmp_path / "out", target="onnxruntime", version=3)
    with pytest.raises(AotforgeError, match="already exists"):
        quick_build(model, tmp_path / "out", target="onnxruntime", version=3)
    assert quick_build(model, tmp_path / "out", target="onnxruntime").manifest.version == 4


def test_a_version_lost_at_the_rename_moves_to_the_next_one(tmp_path: Path) -> None:
    """The race itself, made deterministic: another build publishes v1 between placing and storing."""
    from aotforge.artifacts.store import finalize, staging_dir
    from aotforge.compiler.build_tail import place_artifact
    from tests.conftest import quick_build

    model = str(relu_add(tmp_path / "m.onnx"))
    out = tmp_path / "out"
    first = quick_build(model, tmp_path / "other", target="onnxruntime", name="m")
    place = place_artifact(out, "m", None, "onnxruntime")
    assert place.version == 1
    quick_build(model, out, target="onnxruntime")  # takes version 1 first
    with staging_dir(out) as stage:
        (stage / "model.onnx").write_bytes((first.path / "model.onnx").read_bytes())
        stored, final = finalize(stage, first.manifest, out, explicit=False)
    assert stored.version == 2 and final == out / "m" / "2" / "onnxruntime"
    with staging_dir(out) as stage:
        (stage / "model.onnx").write_bytes(b"x")
        with pytest.raises(AotforgeError, match="already exists"):
            finalize(stage, first.manifest, out, explicit=True)
