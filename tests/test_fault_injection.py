"""The fault-injection suite: a generated malformed-model corpus on both CPU targets, kill -9 at
random points of compile, push and pull, and concurrent pushes, asserting what docs/robustness.md
promises: 0 crashes, 0 tracebacks, every error one line starting ``error:``; 0 files left in --out or
the registry by a killed run after the next run's sweep; 0 lost or duplicated versions.

The default run takes a seeded sample of the corpus; ``-m slow`` runs all of it and more kills.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.artifacts import debris
from aotforge.artifacts.local_registry import LocalRegistry
from aotforge.artifacts.signing import verified_manifest
from aotforge.compiler.cli import main
from tests.conftest import CPU_TARGETS
from tests.fault_corpus import corpus
from tests.tiny_models import relu_add

ROOT = Path(__file__).resolve().parent.parent
CORPUS = corpus()
CASES = [(name, target) for name in sorted(CORPUS) for target in CPU_TARGETS]
SAMPLE = random.Random(16).sample(CASES, min(12, len(CASES)))
SLOW_REST = [c for c in CASES if c not in SAMPLE]


def _artifacts_only(out: Path) -> None:
    """Nothing in --out but complete, intact artifacts (``<name>/<version>/<target>``)."""
    if not out.exists():
        return
    for entry in out.rglob("*"):
        assert not entry.name.startswith("."), f"debris left: {entry}"
    for target_dir in out.glob("*/*/*"):
        verified_manifest(target_dir)


def _check_case(name: str, target: str, tmp_path: Path) -> None:
    model = CORPUS[name](tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            "compile",
            str(model),
            "--target",
            target,
            "--out",
            str(out),
            "--no-bench",
            "--backend-deadline",
            "120",
            "--run-deadline",
            "5",
        ],
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), (name, result.exception)
    assert "Traceback" not in result.output, result.output
    if result.exit_code != 0:
        errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and result.output.strip().splitlines()[-1] == errors[0], result.output
        assert len(errors[0]) > 30  # names a cause, not just a word
    _artifacts_only(out)


def test_corpus_covers_both_targets_with_at_least_150_cases() -> None:
    assert len(CORPUS) * 2 >= 150


@pytest.mark.parametrize(("name", "target"), SAMPLE)
def test_corpus_sample(name: str, target: str, tmp_path: Path) -> None:
    _check_case(name, target, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "target"), SLOW_REST)
def test_corpus_rest(name: str, target: str, tmp_path: Path) -> None:
    _check_case(name, target, tmp_path)


def _past_grace(directory: Path) -> None:
    """Age every temporary as if the sweep's grace period had passed since the kill."""
    past = time.time() - debris.GRACE_S - 5
    for entry in directory.rglob(".*"):
        os.utime(entry, (past, past))


def _killed(args: list[str], delay: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the build and its isolated child
        proc.wait()


def _kill_compiles(tmp_path: Path, delays: list[float], target: str) -> None:
    from tests.conftest import quick_build

    model = relu_add(tmp_path / "m.onnx")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "aotforge", "compile", str(model), "--target", target, "--out", str(out), "--no-bench"]
    for delay in delays:
        _killed(cmd, delay)
    _past_grace(out)
    quick_build(str(model), out, target=target)  # the next run sweeps
    _artifacts_only(out)
    versions = sorted(int(p.name) for p in (out / "m").iterdir())
    assert versions == list(range(1, len(versions) + 1)), versions  # none lost to debris


def test_kill_9_during_compile(tmp_path: Path) -> None:
    _kill_compiles(tmp_path, [2.0, 6.0], "onnxruntime")


@pytest.mark.slow
@pytest.mark.parametrize("target", CPU_TARGETS)
def test_kill_9_during_compile_at_random_points(target: str, tmp_path: Path) -> None:
    rng = random.Random(70)
    _kill_compiles(tmp_path, [rng.uniform(0.5, 25.0) for _ in range(10)], target)


def _kill_push_pull(tmp_path: Path, delays: list[float]) -> None:
    from tests.conftest import quick_build

    art = quick_build(str(relu_add(tmp_path / "m.onnx", shape=(1, 1 << 20))), tmp_path / "out", target="onnxruntime")
    reg_root, pulls = tmp_path / "reg", tmp_path / "pulls"
    pulls.mkdir()
    client = "from aotforge.artifacts.local_registry import LocalRegistry as R; import sys; r = R(sys.argv[1]); "
    push, pull = client + "r.push(sys.argv[2])", client + "r.pull('m:1', sys.argv[2])"
    for delay in delays:
        _killed([sys.executable, "-c", push, str(reg_root), str(art.path)], delay)
    _past_grace(reg_root)
    reg = LocalRegistry(reg_root)
    assert reg.push(art.path) == ("m", 1)  # sweeps what the killed pushes left
    for i, delay in enumerate(delays):
        _killed([sys.executable, "-c", pull, str(reg_root), str(pulls / f"p{i}")], delay)
    _past_grace(pulls)
    reg.pull("m:1", pulls / "final")  # sweeps what the killed pulls left beside --dest
    assert [p.name for p in (reg_root / "blobs").iterdir() if not p.name.endswith(".tar.gz")] == []
    assert [e.ref for e in reg.list()] == ["m:1"]
    for entry in pulls.iterdir():
        assert not entry.name.startswith("."), f"debris left: {entry}"
        verified_manifest(entry)  # a killed pull leaves nothing or a whole, intact artifact


def test_kill_9_during_push_and_pull(tmp_path: Path) -> None:
    _kill_push_pull(tmp_path, [1.5, 3.0])


@pytest.mark.slow
def test_kill_9_during_push_and_pull_at_random_points(tmp_path: Path) -> None:
    rng = random.Random(53)
    _kill_push_pull(tmp_path, [rng.uniform(0.3, 6.0) for _ in range(10)])
