"""The worker side of ``compiler.isolation``: started as ``python -I -c <boot> ...``, nothing else imports it.

``main(argv)``: argv is the pipe's fd, the parent's pid, the memory limit in MB (0: none) and the
modules to import before the request arrives. It dies with its parent, reads one pickled request
from stdin, runs it and writes JSON lines to the pipe.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import pickle
import resource
import signal
import sys
from typing import IO, Any

from aotforge.core.errors import AotforgeError, describe

_PR_SET_PDEATHSIG = 1


class Channel:
    """What the stage function is handed: progress lines and named phases with their own deadline."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe

    def send(self, message: dict[str, Any]) -> None:
        self._pipe.write(json.dumps(message, default=str).encode() + b"\n")
        self._pipe.flush()

    def say(self, message: str) -> None:
        self.send({"say": message})

    def phase(self, name: str, deadline_s: float | None = None) -> None:
        self.send({"phase": name, "deadline_s": deadline_s})


def main(argv: list[str]) -> int:
    fd, parent, memory_mb, *preload = argv
    faulthandler.disable()  # a crash is reported by the parent in one line, not as a stack dump
    _die_with(int(parent))
    if int(memory_mb):
        size = int(memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    with os.fdopen(int(fd), "wb") as pipe:
        channel = Channel(pipe)
        _preload(preload)
        try:
            job = pickle.load(sys.stdin.buffer)
            _adopt(job.get("cwd"), job.get("environ"))
            module_name, _, name = job["call"].partition(":")
            payload: dict[str, Any] = {
                "ok": getattr(importlib.import_module(module_name), name)(job["request"], channel)
            }
        except AotforgeError as e:
            payload = {"error": type(e).__name__, "message": str(e)}
        except MemoryError:
            payload = {"memory": True}
        except BaseException as e:  # the backend's own exception: reported in one line, not a traceback
            payload = {"crash": f"{type(e).__name__}: {describe(e)}"}
        channel.send(payload)
    return 0


def _adopt(cwd: str | None, environ: dict[str, Any] | None) -> None:
    """The requesting build's cwd and environment changes: this worker may have been started (as a
    spare) before either changed."""
    if environ is not None:
        os.environ.update(environ["set"])
        for name in environ["unset"]:
            os.environ.pop(name, None)
    if cwd is not None:
        os.chdir(cwd)


def _preload(modules: list[str]) -> None:
    """Import what the stage will need while the parent still works on what it will ask; a module
    that fails here fails again, reported, when the stage imports it."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:
            pass


def _die_with(parent: int) -> None:
    """Linux: SIGKILL this worker when the build that started it dies (a kill -9 of the build must not
    leave its compile running with nobody to enforce the deadline)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the deadline still holds while the parent lives
    if os.getppid() != parent:  # the parent died before the prctl: nobody would be told
        os._exit(1)
