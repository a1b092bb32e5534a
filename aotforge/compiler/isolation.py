"""Backend stages in a child process, with a deadline and a memory limit.

A segfault, abort, OOM or hang inside TVM, ONNX Runtime or a vendor SDK would otherwise end (or
freeze) the whole build. The stage runs in a forked child (the IR, the target and its options are
inherited, nothing is serialised on the way in); what it writes lands in the stage directory, and
its return value comes back as JSON through a pipe. A child that dies by a signal, runs past the
deadline or exceeds the memory limit is one :class:`CompileError` naming the stage; nothing is
published because the parent raises before the rename.
"""

from __future__ import annotations

import ctypes
import dataclasses
import faulthandler
import json
import os
import resource
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from aotforge.core import errors
from aotforge.core.errors import AotforgeError, CompileError, describe

_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Limits of one isolated stage. ``memory_mb=None``: no limit beyond the host's."""

    deadline_s: float = 3600.0
    memory_mb: int | None = None
    #: False runs the stage in this process (for debugging a backend under a debugger).
    enabled: bool = True


def run_isolated(work: Callable[[], Any], *, stage: str, limits: Isolation) -> Any:
    """``work()`` (returning JSON values) in a child process; its value, or its error re-raised here."""
    if not limits.enabled:
        return work()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _child(work, write_fd, limits)
    os.close(write_fd)
    payload, timed_out = _collect(read_fd, pid, limits.deadline_s)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        raise CompileError(
            f"{stage} did not finish within {limits.deadline_s:g} s and was stopped: a hang in the backend, or "
            "a model too large for the deadline; raise backend_deadline_s if it only needs longer"
        )
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = f" (memory limit {limits.memory_mb} MB)" if limits.memory_mb and sig in (6, 9) else ""
        raise CompileError(
            f"{stage} crashed with {name}{hint} inside the backend: nothing was published; report the backend "
            "bug with the model, or try another target or fewer passes"
        )
    return _result(payload, stage, limits)


def _child(work: Callable[[], Any], write_fd: int, limits: Isolation) -> None:
    code = 0
    try:
        faulthandler.disable()  # a crash is reported by the parent in one line, not as a stack dump
        os.setpgid(0, 0)  # its own group: the deadline stops the compilers it started too
        _die_with_parent()
        if limits.memory_mb is not None:
            size = limits.memory_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
        try:
            payload: dict[str, Any] = {"ok": work()}
        except AotforgeError as e:
            payload = {"error": type(e).__name__, "message": str(e)}
        except MemoryError:
            payload = {"memory": True}
        except BaseException as e:  # the backend's own exception: reported, not a traceback
            payload = {"crash": f"{type(e).__name__}: {describe(e)}"}
        data = json.dumps(payload, default=str).encode()
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
    except BaseException:
        code = 70
    finally:
        os._exit(code)  # no atexit handlers, no parent cleanup run twice


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the build that forked it dies (a kill -9 of the build must not
    leave its compile running, outside the build's process group, with nobody to enforce the deadline)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the deadline still holds while the parent lives


def _collect(read_fd: int, pid: int, deadline_s: float) -> tuple[bytes, bool]:
    """Everything the child writes, until it closes the pipe or the deadline passes (then it is killed)."""
    chunks: list[bytes] = []
    end = time.monotonic() + deadline_s
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                _kill(pid)
                return b"", True
            ready, _, _ = select.select([pipe], [], [], min(left, 1.0))
            if ready:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    return b"".join(chunks), False
                chunks.append(chunk)


def _kill(pid: int) -> None:
    for target in (-pid, pid):  # its group (compilers it started), then itself if setpgid had not run yet
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _result(payload: bytes, stage: str, limits: Isolation) -> Any:
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise CompileError(f"{stage} ended without a result (the child exited early): report the backend bug")
    if "ok" in data:
        return data["ok"]
    if "error" in data:
        kind = getattr(errors, str(data["error"]), CompileError)
        kind = kind if isinstance(kind, type) and issubclass(kind, AotforgeError) else CompileError
        raise kind(str(data["message"]))
    if data.get("memory"):
        raise CompileError(
            f"{stage} ran out of memory (limit {limits.memory_mb} MB): raise backend_memory_mb or use a bigger host"
        )
    raise CompileError(f"{stage} failed inside the backend ({data.get('crash')}): report the backend bug")
