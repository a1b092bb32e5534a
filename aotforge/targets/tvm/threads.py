"""The tvm runtime's thread count, fixed in the environment: one thread per physical core, found once.

Every parallel loop a tvm kernel runs calls ``TVMBackendParallelLaunch``, which asks
``threading::MaxConcurrency()`` how many threads to use. With neither ``TVM_NUM_THREADS`` nor
``OMP_NUM_THREADS`` set, that calls ``std::thread::hardware_concurrency()``, which glibc answers by
opening and reading ``/sys/devices/system/cpu/online``: three system calls per kernel launch. For a
small decoder that is most of a step (the 2-layer draft of ``tests/lm_pair.py``). And tvm then halves that count on
x86-64, assuming every core runs two hardware threads: on a machine without SMT (a 2-vCPU cloud VM that
reports 2 cores of 1 thread) it ran on one core of two, half of what ONNX Runtime and llama.cpp use.
So a tvm runner, before it runs anything, sets ``TVM_NUM_THREADS`` to the physical cores this process
may run on (what ONNX Runtime's default intra-op pool takes), or, where those cannot be counted, to
tvm's own default. A count the user set (either variable) is left as it is.
"""

from __future__ import annotations

import os
import platform

import psutil

THREAD_VARIABLES = ("TVM_NUM_THREADS", "OMP_NUM_THREADS")


def tvm_default_threads(cpus: int, machine: str) -> int:
    """What tvm 0.27's ``MaxConcurrency()`` returns when no variable is set, for ``cpus`` online CPUs."""
    if machine.lower() in ("x86_64", "amd64"):
        cpus //= 2  # tvm's own "ignore hyper-threading" halving (threading_backend.cc)
    return max(cpus, 1)


def default_threads(physical_cores: int | None, usable_cpus: int, machine: str) -> int:
    """One thread per physical core, at most one per CPU this process may use; tvm's own count when the cores
    are unknown (``physical_cores`` None)."""
    if not physical_cores:
        return tvm_default_threads(usable_cpus, machine)
    return max(min(physical_cores, usable_cpus), 1)


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def fix_thread_count() -> None:
    """Set ``TVM_NUM_THREADS`` to the physical cores unless the user chose a count (see the module)."""
    if any(name in os.environ for name in THREAD_VARIABLES):  # even empty: tvm reads it (as 1)
        return
    threads = default_threads(psutil.cpu_count(logical=False), _usable_cpus(), platform.machine())
    os.environ["TVM_NUM_THREADS"] = str(threads)
