"""The thread count the environment gives a runtime that was asked for none."""

from __future__ import annotations

import os


def environment_threads() -> int:
    """``OMP_NUM_THREADS`` where it is a positive count, else 0 (the runtime's own default).

    ONNX Runtime's own thread pool reads no variable, but tvm's pool and torch read this one. A session aotforge
    opens without a count takes it, so one variable bounds every runtime's threads in a process (several servers
    or workers sharing a host's cores)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 0
