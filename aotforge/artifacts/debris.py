"""Temporary files and directories that say who owns them, and the sweep that removes a dead owner's.

A build, push or pull killed with ``kill -9`` cannot clean up after itself: its ``.staging-*``
directory, registry blob temp file or ``.unpack-*`` directory stays. Every such temporary is named
``<prefix><host>.<pid>.<random>``, so the next run in the same place can tell that its owner is gone
(same host, no such process) and remove it once it is also older than a grace period (a pid can be
reused; a clock can jump). A temporary from another host is only removed when it is very old.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

#: A temporary whose owner is gone is left alone this long (seconds) before it is swept.
GRACE_S = 60.0
#: A temporary of another host (a shared filesystem) is swept only when this old.
FOREIGN_AGE_S = 24 * 3600.0
_OWNER = re.compile(r"(?P<host>[A-Za-z0-9_-]{1,64})\.(?P<pid>\d{1,10})\.")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64] or "host"


def owner_tag() -> str:
    """``<host>.<pid>.``: what follows a temporary's prefix."""
    return f"{_host()}.{os.getpid()}."


def make_temp_dir(directory: Path, prefix: str) -> Path:
    """A new directory ``<directory>/<prefix><host>.<pid>.<random>`` (mode per the umask, like any directory)."""
    path = Path(tempfile.mkdtemp(prefix=prefix + owner_tag(), dir=directory))
    path.chmod(0o777 & ~_umask())  # mkdtemp makes 0700: the artifact it becomes must be readable per the umask
    return path


def make_temp_file(directory: Path, prefix: str, suffix: str = ".tmp") -> Path:
    """A new empty file ``<directory>/<prefix><host>.<pid>.<random><suffix>`` (mode per the umask)."""
    fd, name = tempfile.mkstemp(prefix=prefix + owner_tag(), suffix=suffix, dir=directory)
    os.close(fd)
    path = Path(name)
    path.chmod(0o666 & ~_umask())  # mkstemp makes 0600: a serving account must be able to read the blob
    return path


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask would, for a moment, for every thread)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_stale(path: Path, prefix: str, now: float | None = None, grace_s: float = GRACE_S) -> bool:
    """Whether ``path`` is a temporary with ``prefix`` whose owner is gone (and old enough to be sure)."""
    if not path.name.startswith(prefix):
        return False
    try:
        age = (now if now is not None else time.time()) - path.lstat().st_mtime
    except OSError:
        return False
    match = _OWNER.match(path.name[len(prefix) :])
    if match is None:
        return False  # not named by this module: never ours to remove
    if match["host"] != _host():
        return age > FOREIGN_AGE_S  # another host's (a shared filesystem): only by age
    return age > grace_s and not _alive(int(match["pid"]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def sweep(directory: Path, prefix: str, grace_s: float = GRACE_S) -> list[Path]:
    """Remove the stale temporaries with ``prefix`` directly in ``directory``; returns what was removed."""
    removed: list[Path] = []
    try:
        candidates = [p for p in directory.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    now = time.time()
    for path in candidates:
        if not is_stale(path, prefix, now, grace_s):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if not path.exists():
            removed.append(path)
    return removed
