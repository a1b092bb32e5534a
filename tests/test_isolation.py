"""Backend stages run in a spawned worker: a segfault, a hang or an OOM there is one error, not the end of the run.

The stand-ins (tests/isolation_stand_ins.py, tests/isolation_targets.py) really crash (a NULL read
through ctypes), really hang (sleep) and really allocate past the limit, in the worker the build
uses; the parent is untouched. The worker is spawned, never forked: a fork of a process running
torch / ORT / rich threads deadlocked (one test below runs builds inside such a process).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge import targets
from aotforge.compiler.cli import main
from aotforge.compiler.isolation import Isolation, Worker, keep_spare_workers, run_isolated, take_worker
from aotforge.core.errors import CompileError, UnsupportedModelError, ValidationFailedError
from tests import hostile_models
from tests.tiny_models import relu_add

ROOT = Path(__file__).resolve().parent.parent
STAND_INS = "tests.isolation_stand_ins:"
#: How long a test waits on a process that should already be gone before failing instead of hanging.
_HANG_GUARD_S = 300


def _run(name: str, limits: Isolation = Isolation(), request: object = None, say=None) -> object:
    return run_isolated(STAND_INS + name, request, stage="the tvm compile", limits=limits, say=say)


def test_a_result_and_progress_come_back() -> None:
    said: list[str] = []
    assert _run("echo", request={"a": [1, 2]}, say=said.append) == {"a": [1, 2]}
    assert said == ["hello from the worker"]
    assert _run("pid") != os.getpid()


def test_a_spare_worker_is_ready_for_the_next_build_and_sees_its_cwd_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = keep_spare_workers(True)
    try:
        first = take_worker(Isolation(), ("json",))
        spare = take_worker(Isolation(), ("json",))  # the one started when the first was taken
        assert spare.alive()
        # What changed after the spare started reaches it with the request.
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("AOTFORGE_TEST_SPARE", "now")
        seen = spare.run(STAND_INS + "where", None, stage="the stage")
        assert seen["cwd"] == str(tmp_path) and seen["env"] == "now"
        assert first.run(STAND_INS + "where", None, stage="the stage")["pid"] != seen["pid"]  # one request each
        assert not spare.alive()
    finally:
        keep_spare_workers(before)  # off: closes the spare started for a next build that never comes


def test_a_segfault_is_one_error_naming_the_stage() -> None:
    with pytest.raises(CompileError, match=r"^the tvm compile crashed with SIGSEGV"):
        _run("segfault")


def test_an_abort_is_one_error() -> None:
    with pytest.raises(CompileError, match="crashed with SIGABRT"):
        _run("abort")


def test_a_hang_is_stopped_at_the_deadline() -> None:
    """The error names the deadline and the hung worker is killed (SIGKILL) and reaped, not left sleeping."""
    worker = Worker(Isolation(deadline_s=1))
    with pytest.raises(CompileError, match=r"^the tvm compile did not finish within 1 s and was stopped"):
        run_isolated(STAND_INS + "hang", None, stage="the tvm compile", limits=worker.limits, worker=worker)
    assert worker._proc.returncode == -signal.SIGKILL


def test_a_phase_has_its_own_deadline() -> None:
    with pytest.raises(CompileError, match=r"^the validation run 1 of 1 did not finish within 1 s.*--run-deadline"):
        _run("hang_in_a_phase")


def test_the_memory_limit_holds() -> None:
    with pytest.raises(CompileError, match="out of memory|memory limit"):
        _run("hog", Isolation(memory_mb=1024))


def test_our_errors_cross_back_with_their_type_others_as_one_line() -> None:
    with pytest.raises(UnsupportedModelError, match="op X"):
        _run("refuse")
    with pytest.raises(CompileError, match=r"failed inside the backend \(KeyError"):
        _run("raise_plain")


def _compile(model: Path, out: Path, *extra: str) -> list[str]:
    args = ["compile", str(model), "--target", "onnxruntime", "--out", str(out), "--no-bench", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    return [ln for ln in result.output.splitlines() if ln.strip()]


@pytest.mark.parametrize(
    ("stand_in", "deadline", "message"),
    [
        ("SegfaultingOrt", "300", "error: the onnxruntime compile crashed with SIGSEGV"),
        ("HangingOrt", "3", "error: the onnxruntime compile did not finish within 3 s"),
        (
            "HangingRunOrt",
            "300",
            "error: the validation run 1 of 3 of the onnxruntime artifact did not finish within 2 s",
        ),
    ],
)
def test_a_build_whose_backend_crashes_or_hangs_fails_cleanly(
    stand_in: str, deadline: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real onnxruntime target with its compile (or its artifact's run) replaced: isolation is the default."""
    monkeypatch.setitem(targets.TARGETS, "onnxruntime", f"tests.isolation_targets:{stand_in}")
    out = tmp_path / "out"
    lines = _compile(relu_add(tmp_path / "m.onnx"), out, "--backend-deadline", deadline, "--run-deadline", "2")
    assert lines[-1].startswith(message), lines
    assert list(out.iterdir()) == []  # nothing published, no staging left


def test_a_loop_of_2_30_iterations_stops_at_the_run_deadline(tmp_path: Path) -> None:
    """Before: validation's reference run of this model never returned, and the build with it."""
    lines = _compile(hostile_models.write("loop_2_30", tmp_path), tmp_path / "out", "--run-deadline", "2")
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert errors == lines[-1:] and errors[0].startswith("error: the source model loop_2_30.onnx did not finish"), lines
    assert "within 2 s" in errors[0], errors  # the deadline given, not another one
    assert "raise --run-deadline" in errors[0] and "Traceback" not in "\n".join(lines)


def test_the_reference_deadline_is_a_validation_error(tmp_path: Path) -> None:
    from aotforge.compiler.frontend_onnx import load_onnx

    source = load_onnx(hostile_models.write("loop_2_30", tmp_path), run_deadline_s=1)
    with pytest.raises(ValidationFailedError, match="within 1 s"):
        source.reference({"x": __import__("numpy").zeros((1, 4), "float32")})


def test_the_worker_dies_with_a_killed_build(tmp_path: Path) -> None:
    """kill -9 of the build (not its group) must not leave the isolated compile running."""
    pid_file = tmp_path / "child.pid"
    code = (
        "import sys; from aotforge.compiler.isolation import Isolation, keep_spare_workers, run_isolated, take_worker; "
        "run_isolated('tests.isolation_stand_ins:write_pid_and_hang', sys.argv[1], stage='s', limits=Isolation())"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(pid_file)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    while not pid_file.exists() or not pid_file.read_text():  # the build is alive, so its worker is on its way
        assert parent.poll() is None, f"the build ended (status {parent.returncode}) before its worker ran"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    try:
        pidfd = os.pidfd_open(child)
    except ProcessLookupError:
        pytest.fail("the worker was gone before its build was killed")
    parent.kill()
    parent.wait()
    # The kernel sends the worker SIGKILL as the build exits (PR_SET_PDEATHSIG); the pidfd turns readable when
    # it has exited. The timeout only keeps a surviving worker from hanging the run: a pass never waits on it.
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    exited = bool(poller.poll(_HANG_GUARD_S * 1000))
    os.close(pidfd)
    if not exited:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the isolated worker outlived the killed build")


#: Threads that hold locks all the time (dataclasses.asdict, where the forked child deadlocked; torch's
#: and ORT's pools; a rich live display), then isolated builds and stages from the main thread.
_BUSY_PROCESS = """
import dataclasses, sys, threading, time
import numpy as np, onnxruntime as ort, torch
from rich.console import Console
from rich.live import Live
from aotforge.compiler.isolation import Isolation, Worker, keep_spare_workers, run_isolated, take_worker
from aotforge.compiler.options import BuildOptions
import aotforge

stop = threading.Event()
def asdict_loop():
    opts = BuildOptions()
    while not stop.is_set():
        dataclasses.asdict(opts)
def torch_loop():
    a = torch.randn(256, 256)
    while not stop.is_set():
        a @ a
def ort_loop(path):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = np.zeros((1, 8), np.float32)
    while not stop.is_set():
        session.run(None, {"x": x})
threads = [threading.Thread(target=f, args=a, daemon=True)
           for f, a in ((asdict_loop, ()), (asdict_loop, ()), (torch_loop, ()), (ort_loop, (sys.argv[1],)))]
for t in threads:
    t.start()
with Live("building", console=Console(file=sys.stderr), refresh_per_second=20):
    for i in range(int(sys.argv[3])):
        assert run_isolated("tests.isolation_stand_ins:echo", i, stage="s", limits=Isolation()) == i
    result = aotforge.build(sys.argv[1], target="onnxruntime", out=sys.argv[2], bench=False)
stop.set()
for t in threads:
    t.join()
print("ok", result.path)
"""


def test_isolated_builds_inside_a_process_running_torch_ort_and_rich_threads(tmp_path: Path) -> None:
    model = relu_add(tmp_path / "m.onnx")
    proc = subprocess.run(
        [sys.executable, "-c", _BUSY_PROCESS, str(model), str(tmp_path / "out"), "20"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "ok " in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert (tmp_path / "out" / "m" / "1" / "onnxruntime" / "manifest.json").is_file()
