"""Backend stages in a spawned worker process, with a deadline and a memory limit.

A segfault, abort, OOM or hang inside TVM, ONNX Runtime or a vendor SDK would otherwise end (or
freeze) the whole build. The stage runs in a fresh interpreter (``python -I``, the parent's
``sys.path``: the same aotforge), never a fork: a fork of a process whose torch / ONNX Runtime /
rich threads held a lock deadlocked the child on that lock (a futex in ``dataclasses.asdict``).

The request goes to the worker's stdin as a pickle (parent to child only: the same code on both
sides, nothing stored); what comes back is JSON lines on a pipe (progress, the phase the stage is
in with its own deadline, then the result), and arrays as npz files read with
``allow_pickle=False``: the child never hands the parent something to deserialise as code. A
worker that dies by a signal, runs past a deadline or exceeds the memory limit is one
:class:`CompileError` naming the stage (and the phase); nothing is published because the caller
raises before the rename. Cost: one interpreter start and the stage's imports (README: figures).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from aotforge.core import errors
from aotforge.core.errors import AotforgeError, CompileError

#: The worker's entry: the parent's sys.path first (``-I`` dropped PYTHONPATH, the cwd, user site).
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from aotforge.compiler.isolation_child import main; sys.exit(main(sys.argv[2:]))"
)
#: How much of the worker's own output (a backend's C++ message before an abort) a crash error quotes.
_LAST_WORDS = 300


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Limits of one isolated stage. ``memory_mb=None``: no limit beyond the host's.

    The memory limit is the worker's address space (``RLIMIT_AS``), its imports included.
    """

    deadline_s: float = 3600.0
    memory_mb: int | None = None
    #: Each validation run of the compiled artifact (a phase of the stage) has this deadline of its own.
    run_deadline_s: float = 600.0
    #: False runs the stage in this process (for debugging a backend under a debugger).
    enabled: bool = True


Say = Callable[[str], None]


class Worker:
    """One spawned worker: started (its ``preload`` modules imported) before its request is known, so
    its start overlaps the caller's own work; :meth:`run` hands it one request. Use it as a context
    manager: leaving it kills a worker still alive."""

    def __init__(self, limits: Isolation, preload: Sequence[str] = ()) -> None:
        self.limits = limits
        self.owner = os.getpid()  # a forked child must not take its parent's spare (see take_worker)
        self._environ = dict(os.environ)  # what the worker inherits; run() sends what changed since
        read_fd, write_fd = os.pipe()
        # Its output (a backend's messages) is kept for a crash's error line, never shown as it comes.
        self._log: IO[bytes] | None = tempfile.TemporaryFile()
        args = [json.dumps(sys.path), str(write_fd), str(os.getpid()), str(limits.memory_mb or 0), *preload]
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, *args],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            process_group=0,  # its own group: a deadline stops the compilers it started too
            close_fds=True,
        )
        os.close(write_fd)
        self._pipe: IO[bytes] | None = os.fdopen(read_fd, "rb", buffering=0)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            _kill(self._proc.pid)
        self._proc.wait()
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def alive(self) -> bool:
        return self._proc.poll() is None and self._pipe is not None

    def run(self, call: str, request: Any, *, stage: str, say: Say | None = None) -> Any:
        """``call`` ("module:function", taking ``(request, channel)``) in the worker; its JSON value, or
        its error re-raised here (our own error types keep their type)."""
        assert self._proc.stdin is not None and self._pipe is not None, "a worker runs one request"
        # The cwd and environment of now, not of the worker's start: a spare (take_worker) started earlier.
        now = dict(os.environ)
        environ = {
            "set": {k: v for k, v in now.items() if self._environ.get(k) != v},
            "unset": [k for k in self._environ if k not in now],
        }
        job = {"call": call, "request": request, "cwd": os.getcwd(), "environ": environ}
        try:
            pickle.dump(job, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.close()
        except BrokenPipeError:
            pass  # it died starting up: its exit status says how
        message, phase = self._collect(stage, say or (lambda _msg: None))
        status = self._proc.wait()
        if status < 0 or message is None:
            raise self._crash(stage, phase, status)
        return _result(message, stage, self.limits)

    def _collect(self, stage: str, say: Say) -> tuple[dict[str, Any] | None, str]:
        """Messages until the result or EOF; a deadline passed (the stage's, or its phase's) kills the worker."""
        assert self._pipe is not None
        end = time.monotonic() + self.limits.deadline_s
        phase, phase_end, phase_limit, buffer = "", end, 0.0, b""
        while True:
            now = time.monotonic()
            if now >= min(end, phase_end):
                _kill(self._proc.pid)
                raise _timeout(stage, (phase, phase_limit) if phase_end < end else None, self.limits)
            ready, _, _ = select.select([self._pipe], [], [], min(min(end, phase_end) - now, 1.0))
            if not ready:
                continue
            chunk = self._pipe.read(1 << 16)
            if not chunk:
                return None, phase
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if "phase" in message:
                    phase = str(message["phase"])
                    phase_limit = float(message.get("deadline_s") or 0.0)
                    phase_end = time.monotonic() + phase_limit if phase_limit else end
                elif "say" in message:
                    say(str(message["say"]))
                else:
                    return message, phase

    def _crash(self, stage: str, phase: str, status: int) -> CompileError:
        where = phase or stage
        words = self._last_words()
        said = f"; its last message: {words}" if words else ""
        if status < 0:
            sig = -status
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            hint = f" (memory limit {self.limits.memory_mb} MB)" if self.limits.memory_mb and sig in (6, 9) else ""
            return CompileError(
                f"{where} crashed with {name}{hint} inside the backend{said}: nothing was published; report the "
                "backend bug with the model, or try another target or fewer passes"
            )
        return CompileError(f"{where} ended without a result (exit status {status}{said}): report the backend bug")

    def _last_words(self) -> str:
        """The worker's last line of output (a C++ backend prints its reason before aborting)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [ln.strip() for ln in self._log.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:_LAST_WORDS] if lines else ""


#: Started workers waiting for this process's next build, by (preload, memory limit); see take_worker.
_SPARES: dict[tuple[tuple[str, ...], int | None], Worker] = {}
_KEEP_SPARES = [os.environ.get("AOTFORGE_SPARE_WORKERS", "") == "1"]


def keep_spare_workers(keep: bool = True) -> bool:
    """Keep one started worker ready for the next build of the same kind in this process.

    A worker's start is an interpreter plus the backend's imports (tvm: ~3.5 s on 2 cores); a process
    that builds many models (a loop over ``build``, a farm's pool process, a test session) pays it
    once, in the background, instead of on each build's critical path. Off by default: a single CLI
    build would start a spare only to kill it. ``AOTFORGE_SPARE_WORKERS=1`` turns it on. Returns the
    setting it replaced.
    """
    before, _KEEP_SPARES[0] = _KEEP_SPARES[0], keep
    if not keep:
        _close_spares()
    return before


def take_worker(limits: Isolation, preload: Sequence[str] = ()) -> Worker:
    """A started worker with ``preload`` imported: the waiting spare if there is one, else a new one;
    with spares kept, the next one starts now. Each worker still runs exactly one request."""
    key = (tuple(preload), limits.memory_mb)
    spare = _SPARES.pop(key, None)
    if spare is not None and spare.owner == os.getpid() and spare.alive():
        spare.limits = limits  # deadlines are enforced here, in the parent: the spare takes this build's
        worker = spare
    else:
        if spare is not None and spare.owner == os.getpid():
            spare.close()
        worker = Worker(limits, preload)
    if _KEEP_SPARES[0]:
        _SPARES[key] = Worker(limits, preload)
    return worker


def _close_spares() -> None:
    for worker in _SPARES.values():
        if worker.owner == os.getpid():
            worker.close()
    _SPARES.clear()


atexit.register(_close_spares)
os.register_at_fork(after_in_child=_SPARES.clear)  # the parent's spares are its own to close


def run_isolated(
    call: str, request: Any, *, stage: str, limits: Isolation, say: Say | None = None, worker: Worker | None = None
) -> Any:
    """``call(request, channel)`` in ``worker`` (started ahead), else in a fresh one (see :class:`Worker`);
    in this process if not ``limits.enabled``."""
    if not limits.enabled:
        return resolve(call)(request, LocalChannel(say))
    with worker or Worker(limits) as started:
        return started.run(call, request, stage=stage, say=say)


def resolve(call: str) -> Callable[[Any, Any], Any]:
    import importlib

    module, _, name = call.partition(":")
    fn: Callable[[Any, Any], Any] = getattr(importlib.import_module(module), name)
    return fn


class LocalChannel:
    """What a stage function is handed when it runs in this process: progress only, no deadlines."""

    def __init__(self, say: Say | None) -> None:
        self._say = say or (lambda _msg: None)

    def say(self, message: str) -> None:
        self._say(message)

    def phase(self, name: str, deadline_s: float | None = None) -> None:
        """Entering a named part of the stage, with a deadline of its own (enforced only in a worker)."""


def _timeout(stage: str, phase: tuple[str, float] | None, limits: Isolation) -> CompileError:
    if phase is not None:  # a phase's name says which stage it is part of
        return CompileError(
            f"{phase[0]} did not finish within {phase[1]:g} s and was stopped: a model that runs for that "
            "long (a Loop or Scan with a huge trip count), or a hang in the backend; raise --run-deadline if it "
            "only needs longer"
        )
    return CompileError(
        f"{stage} did not finish within {limits.deadline_s:g} s and was stopped: a hang in the backend, or "
        "a model too large for the deadline; raise --backend-deadline if it only needs longer"
    )


def _kill(pid: int) -> None:
    for target in (-pid, pid):  # its group (compilers it started), then itself
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _result(data: dict[str, Any], stage: str, limits: Isolation) -> Any:
    if "ok" in data:
        return data["ok"]
    if "error" in data:
        kind = getattr(errors, str(data["error"]), CompileError)
        kind = kind if isinstance(kind, type) and issubclass(kind, AotforgeError) else CompileError
        raise kind(str(data["message"]))
    if data.get("memory"):
        raise CompileError(
            f"{stage} ran out of memory (limit {limits.memory_mb} MB): raise --backend-memory-mb or use a bigger host"
        )
    raise CompileError(f"{stage} failed inside the backend ({data.get('crash')}): report the backend bug")
