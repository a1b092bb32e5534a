"""The rank graphs' all-reduce as a native ONNX Runtime custom-op library (``all_reduce.c``), built on first use.

The onnxruntime-extensions Python op costs a crossing into Python (the GIL, numpy views, a call) at each of a
decode step's all-reduces; this library runs the same shared-memory all-reduce (``shm_all_reduce.py``'s segment)
from inside ONNX Runtime. gcc builds it once per source and flags into ``~/.cache/aotforge/native/<hash>/``;
the driver builds it before the ranks start, and a host without a compiler falls back to the Python op
(``tensor_parallel.prepare_all_reduce`` records which one the ranks use).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from aotforge.core.errors import CompileError, TargetUnavailableError
from aotforge.targets.generative.shm_all_reduce import ShmAllReduce

SOURCE = Path(__file__).with_name("all_reduce.c")
CACHE = Path.home() / ".cache" / "aotforge" / "native"
LIBRARY = "libaotforge_all_reduce.so"
FLAGS = ("-O3", "-std=gnu11", "-Wall", "-Werror", "-shared", "-fPIC")
#: Seconds a compile may take before it counts as failed.
COMPILE_TIMEOUT_S = 120


def compiler() -> str:
    """The host's C compiler, or a refusal naming what to install."""
    found = shutil.which("gcc") or shutil.which("cc")
    if not found:
        raise TargetUnavailableError(
            "the native all-reduce of tensor-parallel onnxruntime artifacts is built with the host's C compiler, "
            "and this host has none (gcc, cc): install gcc (apt-get install gcc)"
        )
    return found


def build_library(cache: Path = CACHE) -> Path:
    """The compiled library, built into ``cache`` once per (source, flags); a failed compile names gcc's error."""
    cc = compiler()
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:20]
    path = cache / digest / LIBRARY
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Into a temporary name, then renamed: a rank group starting beside this one never loads half a library.
    fd, partial = tempfile.mkstemp(dir=path.parent, suffix=".so.partial")
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S
        )
        if done.returncode != 0:
            raise CompileError(f"{cc} failed to build the native all-reduce ({SOURCE.name}): {done.stderr[-1500:]}")
        os.replace(partial, path)
    except subprocess.TimeoutExpired as e:
        raise CompileError(f"{cc} did not build the native all-reduce within {COMPILE_TIMEOUT_S} s") from e
    finally:
        Path(partial).unlink(missing_ok=True)
    return path


def attach(library: Path, comm: ShmAllReduce) -> None:
    """Point this process's copy of the library at rank ``comm.rank``'s end of the segment, before the sessions
    open. ONNX Runtime's ``register_custom_ops_library`` loads the same file, so it shares this state."""
    lib = ctypes.CDLL(str(library))  # dlopen: the same handle as ONNX Runtime's, once either loaded it
    lib.aotforge_all_reduce_attach.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_double,
    ]  # fmt: skip
    lib.aotforge_all_reduce_attach.restype = ctypes.c_int
    base = comm.flags.ctypes.data  # the segment's first byte: the header's abort flag
    lib.aotforge_all_reduce_attach(base, comm.rank, comm.world, comm.capacity, comm.timeout_s)


def detach(library: Path) -> None:
    """Make this process's copy of the library forget its segment, before the segment is unmapped."""
    ctypes.CDLL(str(library)).aotforge_all_reduce_detach()
