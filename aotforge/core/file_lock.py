"""An exclusive lock between processes on a file beside what it guards (``flock``)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, created where missing and left in place: a lock file removed while
    another process waits on it would let a third one in beside it. Separate opens exclude each other, threads
    of one process included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
