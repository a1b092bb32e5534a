"""The build cache's direct mode: a rebuild with unchanged inputs skips the frontend, any change misses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts import build_cache, build_cache_direct
from aotforge.artifacts.manifest import MANIFEST
from aotforge.compiler import read_tracker
from aotforge.compiler.api import build
from aotforge.compiler.options import BuildOptions
from tests.in_process import ISOLATE_BACKEND

#: Light options. ``passes`` is given, as the CLI always does (its default comes from ``passes``). The backend runs in
#: the test's process (tests/in_process.py): isolation is not part of the cache key, so the CLI's builds still hit.
OPTIONS: dict[str, Any] = {
    "target": "onnxruntime",
    "passes": ("O1",),
    "bench": False,
    "validation_samples": 1,
    "isolate_backend": ISOLATE_BACKEND,
}

MODEL = """
from pathlib import Path

import numpy as np
import torch

WEIGHTS = Path(__file__).with_name("weights.npy")


class Project(torch.nn.Module):
    def __init__(self, w: np.ndarray) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.from_numpy(w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w)


def get_model() -> torch.nn.Module:
    return Project(np.load(WEIGHTS))


def get_example_inputs() -> dict[str, torch.Tensor]:
    return {"x": torch.ones(2, 4)}
"""


def _model(tmp_path: Path, seed: int = 0) -> Path:
    (tmp_path / "m").mkdir(exist_ok=True)
    np.save(tmp_path / "m" / "weights.npy", np.random.default_rng(seed).standard_normal((4, 3)).astype(np.float32))
    path = tmp_path / "m" / "proj.py"
    path.write_text(MODEL)
    return path


def _build(model: Path, out: Path, cache: Path, **kw: Any) -> dict[str, Any]:
    result = build(str(model), out=out, cache_dir=cache, **{**OPTIONS, **kw})
    data: dict[str, Any] = json.loads((result.path / MANIFEST).read_text())
    return data


def _same_artifact(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != "build"} == {k: v for k, v in b.items() if k != "build"}


def test_cli_direct_hit_serves_the_same_artifact_without_importing_torch(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    # The options `aotforge compile MODEL --target onnxruntime --no-bench` resolves to.
    first = _build(model, tmp_path / "a", cache, validation_samples=3)
    assert first["build"]["cache"]["hit"] is False
    assert "direct entry stored" in first["build"]["cache"]["direct"]
    command = [sys.executable, "-X", "importtime", "-m", "aotforge", "compile", str(model)]
    command += ["--target", "onnxruntime", "--no-bench", "--out", str(tmp_path / "b"), "--cache-dir", str(cache)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=os.getcwd(), check=True)
    assert "cache: hit (direct)" in run.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time")}
    assert "click" in imported  # the import log is there, so what is missing from it was not imported
    assert not imported & {"torch", "onnx", "onnx_ir", "onnxruntime", "tvm", "mlflow", "matplotlib"}
    second = json.loads((Path(run.stdout.strip().splitlines()[-1]) / MANIFEST).read_text())
    assert second["build"]["cache"]["direct"] is True
    assert second["build"]["cache"]["key"] == first["build"]["cache"]["key"]
    assert _same_artifact(first, second)


def test_changed_weights_file_misses_and_rebuilds_with_the_new_weights(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    first = _build(model, tmp_path / "a", cache)
    _model(tmp_path, seed=1)  # same size, new values
    second = _build(model, tmp_path / "b", cache)
    assert second["build"]["cache"]["hit"] is False
    assert "weights.npy changed" in second["build"]["cache"]["direct"]
    assert second["ir"]["sha256"] != first["ir"]["sha256"]
    assert second["validation"]["passed"] is True
    third = _build(model, tmp_path / "c", cache)
    assert third["build"]["cache"]["direct"] is True
    assert _same_artifact(second, third)


def test_edited_source_or_options_miss_direct_but_reuse_the_compile(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    first = _build(model, tmp_path / "a", cache)
    model.write_text(model.read_text() + "\n# a comment changes the file, not the IR\n")
    edited = _build(model, tmp_path / "b", cache)
    assert edited["build"]["cache"]["direct"].startswith("no direct entry (nearest of 1 differs in source);")
    assert edited["build"]["cache"]["hit"] is True  # the IR-level key still matches: no compile
    assert edited["build"]["cache"]["key"] == first["build"]["cache"]["key"]
    other = _build(model, tmp_path / "c", cache, tolerance=1e-3)
    assert other["build"]["cache"]["direct"].startswith("no direct entry (nearest of 2 differs in options);")
    assert other["validation"]["tolerance"] == 1e-3


def test_touched_but_unchanged_file_still_hits(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    first = _build(model, tmp_path / "a", cache)
    weights = model.with_name("weights.npy")
    os.utime(weights, ns=(1_000_000_000, 1_000_000_000))  # stat differs, bytes do not
    again = _build(model, tmp_path / "b", cache)
    assert again["build"]["cache"]["direct"] is True
    assert _same_artifact(first, again)


def test_corrupt_ir_entry_under_a_direct_hit_is_rebuilt(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    first = _build(model, tmp_path / "a", cache)
    (lib,) = [p for p in cache.glob("??/*/model.ort.onnx")]
    lib.write_bytes(lib.read_bytes()[:-1] + bytes([lib.read_bytes()[-1] ^ 0xFF]))
    second = _build(model, tmp_path / "b", cache)
    assert second["build"]["cache"]["hit"] is False
    assert "is missing or corrupt" in second["build"]["cache"]["direct"]
    assert _same_artifact(first, second)
    third = _build(model, tmp_path / "c", cache)
    assert third["build"]["cache"]["direct"] is True
    assert _same_artifact(first, third)


def test_a_file_read_then_deleted_makes_the_build_not_direct_cacheable(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    model.write_text(
        model.read_text().replace(
            "    return Project(np.load(WEIGHTS))",
            "    scratch = WEIGHTS.with_name('scratch.npy')\n"
            "    np.save(scratch, np.load(WEIGHTS))\n"
            "    w = np.load(scratch)\n"
            "    scratch.unlink()\n"
            "    return Project(w)",
        )
    )
    first = _build(model, tmp_path / "a", cache)
    assert first["build"]["cache"]["direct"].startswith("no direct entry; not direct-cacheable: ")
    assert "scratch.npy" in first["build"]["cache"]["direct"]
    assert not list((cache / build_cache_direct.DIRECT_DIR).rglob("*.json"))
    second = _build(model, tmp_path / "b", cache)
    assert second["build"]["cache"]["hit"] is True and "direct" in second["build"]["cache"]
    assert second["build"]["cache"]["direct"] != True  # noqa: E712 - a reason, not a hit


def test_explain_skips_direct_and_an_unreadable_direct_entry_is_a_miss(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    first = _build(model, tmp_path / "a", cache)
    opts = BuildOptions.from_dict({**OPTIONS, "out": tmp_path / "b", "cache_dir": cache})
    result = build(str(model), opts, direct_lookup=False)
    cache_record = result.manifest.build["cache"]
    assert cache_record["hit"] is True and cache_record["key"] == first["build"]["cache"]["key"]
    assert cache_record["direct"].startswith("lookup skipped")
    assert build_cache.entry_files(cache, cache_record["key"]) >= {"model.onnx", "model.ort.onnx"}
    (entry,) = (cache / build_cache_direct.DIRECT_DIR).rglob("*.json")
    entry.write_text("{not json")
    again = _build(model, tmp_path / "c", cache)
    assert again["build"]["cache"]["direct"].startswith("direct entry unreadable")
    assert again["build"]["cache"]["hit"] is True
    assert _build(model, tmp_path / "d", cache)["build"]["cache"]["direct"] is True
    assert not [p for p in cache.rglob("*") if p.name.startswith(".tmp-")]


def test_a_file_changed_while_the_build_ran_is_not_trusted(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    model.write_text(
        model.read_text().replace(
            "    return Project(np.load(WEIGHTS))",
            "    w = np.load(WEIGHTS)\n    np.save(WEIGHTS, w * 2)  # after reading: the next build sees other bytes\n"
            "    return Project(w)",
        )
    )
    first = _build(model, tmp_path / "a", cache)
    assert "weights.npy changed while the build ran" in first["build"]["cache"]["direct"]
    assert not list((cache / build_cache_direct.DIRECT_DIR).rglob("*.json"))


def test_an_optional_file_that_appears_later_misses(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    model.write_text(
        model.read_text().replace(
            "    return Project(np.load(WEIGHTS))",
            "    try:\n        scale = float(WEIGHTS.with_name('scale.txt').read_text())\n"
            "    except FileNotFoundError:\n        scale = 1.0\n"
            "    return Project(np.load(WEIGHTS) * np.float32(scale))",
        )
    )
    first = _build(model, tmp_path / "a", cache)
    assert "direct entry stored" in first["build"]["cache"]["direct"]
    model.with_name("scale.txt").write_text("3")
    second = _build(model, tmp_path / "b", cache)
    assert "scale.txt changed" in second["build"]["cache"]["direct"]
    assert second["build"]["cache"]["hit"] is False and second["ir"]["sha256"] != first["ir"]["sha256"]


def test_listed_directory_and_read_files_are_recorded_and_checked(tmp_path: Path) -> None:
    data = tmp_path / "calib"
    data.mkdir()
    (data / "a.npy").write_bytes(b"one")
    with read_tracker.recording() as reads:
        names = sorted(os.listdir(data))
        (data / names[0]).read_bytes()
        (tmp_path / "scratch").write_text("written, never read")
    assert str(data) in reads.listings
    assert reads.files[str(data / "a.npy")] is not None and str(tmp_path / "scratch") not in reads.files
    record = build_cache_direct.record_file(str(data / "a.npy"), reads.files[str(data / "a.npy")])
    digest = build_cache_direct.listing_digest(str(data))
    assert digest is not None
    cache, key = tmp_path / "cache", "ab" * 32
    for value in ("first", "second"):  # a rewrite replaces the entry whole; no temp file is left
        build_cache_direct.store(cache, key, {}, [record], {str(data): digest}, value * 2, {"name": "m"}, "t")
    entry, why = build_cache_direct.lookup(cache, key)
    assert entry is not None and entry.key == "secondsecond", why
    assert not [p for p in cache.rglob("*") if p.name.startswith(".tmp-")]
    (data / "b.npy").write_bytes(b"two")
    assert build_cache_direct.lookup(cache, key) == (None, f"listing of {data} changed")
