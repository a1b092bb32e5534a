"""Backend stages run in a child process: a segfault, a hang or an OOM there is one error, not the end of the run.

The stand-ins below really crash (a NULL read through ctypes), really hang (sleep) and really
allocate past the limit, in the forked child the build uses; the parent is untouched.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.compiler.cli import main
from aotforge.compiler.isolation import Isolation, run_isolated
from aotforge.core.errors import CompileError, UnsupportedModelError
from aotforge.targets.onnxruntime import OrtTarget
from tests.tiny_models import relu_add


def _segfault() -> None:
    ctypes.string_at(0)  # a real SIGSEGV in the child


def _hang() -> None:
    time.sleep(3600)


def _hog() -> None:
    blocks = []
    while True:
        blocks.append(bytearray(64 << 20))


def test_a_result_comes_back_as_json() -> None:
    assert run_isolated(lambda: {"pid": os.getpid()}, stage="s", limits=Isolation())["pid"] != os.getpid()


def test_a_segfault_is_one_error_naming_the_stage() -> None:
    with pytest.raises(CompileError, match=r"the tvm compile crashed with SIGSEGV"):
        run_isolated(_segfault, stage="the tvm compile", limits=Isolation())


def test_an_abort_is_one_error() -> None:
    with pytest.raises(CompileError, match="crashed with SIGABRT"):
        run_isolated(lambda: os.kill(os.getpid(), signal.SIGABRT), stage="s", limits=Isolation())


def test_a_hang_is_stopped_at_the_deadline() -> None:
    started = time.monotonic()
    with pytest.raises(CompileError, match="did not finish within 1 s"):
        run_isolated(_hang, stage="s", limits=Isolation(deadline_s=1))
    assert time.monotonic() - started < 10


def test_the_memory_limit_holds() -> None:
    with pytest.raises(CompileError, match="out of memory|memory limit"):
        run_isolated(_hog, stage="s", limits=Isolation(memory_mb=1024))


def test_our_errors_cross_back_with_their_type() -> None:
    def refuse() -> None:
        raise UnsupportedModelError("op X is not supported: drop it")

    with pytest.raises(UnsupportedModelError, match="op X"):
        run_isolated(refuse, stage="s", limits=Isolation())


@pytest.mark.parametrize(("stand_in", "message"), [(_segfault, "crashed with SIGSEGV"), (_hang, "did not finish")])
def test_a_build_whose_backend_crashes_or_hangs_fails_cleanly(
    stand_in, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real onnxruntime target, its compile replaced by a stand-in that crashes or hangs in the child."""
    monkeypatch.setattr(OrtTarget, "compile", lambda *a, **k: stand_in())
    model = relu_add(tmp_path / "m.onnx")
    out = tmp_path / "out"
    args = [
        "compile",
        str(model),
        "--target",
        "onnxruntime",
        "--out",
        str(out),
        "--no-bench",
        "--isolate-backend",
        "--backend-deadline",
        "2",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: the onnxruntime compile ") and message in lines[-1], result.output
    assert list(out.iterdir()) == []  # nothing published, no staging left


def test_the_child_dies_with_a_killed_build(tmp_path: Path) -> None:
    """kill -9 of the build (not its group) must not leave the isolated compile running."""
    import subprocess
    import sys

    pid_file = tmp_path / "child.pid"
    code = (
        "import os, sys, time; from pathlib import Path; "
        "from aotforge.compiler.isolation import Isolation, run_isolated; "
        "run_isolated(lambda: (Path(sys.argv[1]).write_text(str(os.getpid())), time.sleep(3600)), "
        "stage='s', limits=Isolation())"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    parent = subprocess.Popen([sys.executable, "-c", code, str(pid_file)], env=env)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the isolated child outlived the killed build")
