"""Stage functions for tests/test_isolation.py that really crash, hang or allocate, in the spawned worker.

They live in a module of their own: the worker imports them by name, and this module is light.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

from aotforge.core.errors import UnsupportedModelError


def pid(_request: Any, _channel: Any) -> int:
    return os.getpid()


def echo(request: Any, channel: Any) -> Any:
    channel.say("hello from the worker")
    return request


def segfault(_request: Any, _channel: Any) -> None:
    ctypes.string_at(0)  # a real SIGSEGV


def abort(_request: Any, _channel: Any) -> None:
    os.kill(os.getpid(), signal.SIGABRT)


def hang(_request: Any, _channel: Any) -> None:
    time.sleep(3600)


def hang_in_a_phase(_request: Any, channel: Any) -> None:
    channel.phase("the validation run 1 of 1", 1.0)
    time.sleep(3600)


def hog(_request: Any, _channel: Any) -> None:
    blocks = []
    while True:
        blocks.append(bytearray(64 << 20))


def refuse(_request: Any, _channel: Any) -> None:
    raise UnsupportedModelError("op X is not supported: drop it")


def raise_plain(_request: Any, _channel: Any) -> None:
    raise KeyError("the backend's own bug")


def write_pid_and_hang(request: Any, _channel: Any) -> None:
    from pathlib import Path

    Path(request).write_text(str(os.getpid()))
    time.sleep(3600)


def where(_request: Any, _channel: Any) -> dict[str, Any]:
    """The worker's pid, cwd and one environment variable, as the request found them."""
    return {"pid": os.getpid(), "cwd": os.getcwd(), "env": os.environ.get("AOTFORGE_TEST_SPARE")}
