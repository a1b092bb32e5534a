"""Which files a build's frontend and passes read: the inputs the build cache's direct mode checks.

Python's audit hooks see every ``open`` (``open()``, ``io.open_code`` for imports, ``os.open``) and
directory listing made through Python, in any thread. What they cannot see, and direct mode
therefore cannot track: files that native code reads and closes without Python (a C++ or Rust
reader); files whose mere existence is tested (``os.path.exists``); environment variables, the
clock and random seeds. Files native code still has mapped at the end (``mmap``-based readers,
e.g. safetensors) are picked up from ``/proc/self/maps``.

Files under the Python stdlib and site-packages are left out: the installed distributions'
names, versions and install times stand in for them in the direct key. So are ``/proc``,
``/sys`` and ``/dev`` (host state, not inputs; the host's CPU is in the key) and ``__pycache__``
(derived from the ``.py`` files, which are tracked through ``sys.modules``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

_SYSTEM_PREFIXES = ("/proc/", "/sys/", "/dev/")


#: What ``os.stat`` said of a path when it was first read (None: it did not exist).
Stat = tuple[int, int, int, int] | None


def stat_of(path: str) -> Stat:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class Reads:
    """Paths read (absolute, with their stat at first read) and directories listed while recording."""

    def __init__(self) -> None:
        self.files: dict[str, Stat] = {}
        self.listings: set[str] = set()

    def add_file(self, path: str) -> None:
        # Stat at first read, so a file changed while the build runs is caught (build_direct.remember).
        if path not in self.files:
            self.files.setdefault(path, stat_of(path))


_active: Reads | None = None
_installed = False


def _reads_for_open(mode: object, flags: object) -> bool:
    """Whether an open can read bytes that were there before: "w+"/"x" and O_TRUNC/O_EXCL start empty
    (``tempfile`` probes the temp dir with O_RDWR|O_CREAT|O_EXCL, then deletes the file)."""
    if isinstance(mode, str):
        return "r" in mode or ("a" in mode and "+" in mode)
    if isinstance(flags, int):
        if flags & (os.O_TRUNC | os.O_EXCL):
            return False
        return flags & os.O_ACCMODE in (os.O_RDONLY, os.O_RDWR)
    return True


def _hook(event: str, args: tuple[object, ...]) -> None:
    reads = _active
    if reads is None:  # the hook stays installed for the process's life: keep the idle case cheap
        return
    try:
        if event == "open":
            path = args[0]
            if isinstance(path, (str, bytes)) and _reads_for_open(args[1], args[2] if len(args) > 2 else None):
                reads.add_file(os.path.abspath(os.fsdecode(path)))
        elif event in ("os.listdir", "os.scandir"):
            # The import system lists sys.path directories to find modules; those listings change
            # whenever a file is added anywhere on the path and are not model inputs.
            if "importlib" in sys._getframe(1).f_code.co_filename:
                return
            path = args[0]
            if path is None:
                path = "."
            if isinstance(path, (str, bytes, os.PathLike)):
                reads.listings.add(os.path.abspath(os.fsdecode(path)))
    except Exception:  # an audit hook that raises would break the caller's open()
        return


@contextmanager
def recording(enabled: bool = True) -> Iterator[Reads]:
    """Record reads until the block ends; then add the imported modules' files and the mapped files."""
    global _active, _installed
    if not enabled:
        yield Reads()
        return
    if _active is not None:  # nested builds (a model that builds a model) record into the outer one
        yield _active
        return
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    reads = Reads()
    _active = reads
    try:
        yield reads
    finally:
        _active = None
        for module in list(sys.modules.values()):
            file = getattr(module, "__file__", None)
            # Some modules carry a made-up relative __file__ (torch's "_classes.py"): not a file.
            if isinstance(file, str) and file.endswith(".py") and os.path.isabs(file):
                reads.add_file(file)
        for file in _mapped_files():
            reads.add_file(file)


def _mapped_files() -> set[str]:
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        parts = line.split(maxsplit=5)
        # A writable mapping is state the process keeps (sqlite's -shm), not an input it read.
        if len(parts) < 6 or "w" in parts[1]:
            continue
        if parts[5].startswith("/") and ".so" not in Path(parts[5]).name:
            found.add(parts[5].removesuffix(" (deleted)"))
    return found


def excluded_roots() -> tuple[str, ...]:
    """Trees whose contents the installed distributions' versions stand for."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(os.path.join(sys.base_prefix, "lib"))
    return tuple(sorted(os.path.join(os.path.realpath(r), "") for r in roots))


def tracked(paths: Iterable[str], skip: tuple[str, ...] = ()) -> list[str]:
    """The paths direct mode must check: outside stdlib, site-packages, system trees and ``skip``."""
    roots = excluded_roots() + tuple(os.path.join(os.path.abspath(s), "") for s in skip)
    keep = []
    for path in sorted(paths):
        real = os.path.realpath(path)
        if real.startswith(_SYSTEM_PREFIXES) or "/__pycache__/" in real:
            continue
        if real.startswith(roots) or path.startswith(roots):
            continue
        keep.append(path)
    return keep
