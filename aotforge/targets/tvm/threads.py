"""The tvm runtime's thread count, fixed in the environment so that a kernel launch does not look it up.

Every parallel loop a tvm kernel runs calls ``TVMBackendParallelLaunch``, which asks
``threading::MaxConcurrency()`` how many threads to use. With neither ``TVM_NUM_THREADS`` nor
``OMP_NUM_THREADS`` set, that calls ``std::thread::hardware_concurrency()``, which glibc answers by
opening and reading ``/sys/devices/system/cpu/online``: three system calls per kernel launch. For a
small decoder that is most of a step (the 2-layer x 64 draft of ``tests/lm_pair.py``: 89 us of CPU
per decode call, 18 us with the variable set; AMD EPYC, 2 cores). So a tvm runner, before it
runs anything, sets ``TVM_NUM_THREADS`` to the count tvm would have computed itself (the online CPUs,
halved on x86-64 where tvm assumes hyper-threading, at least 1): the same threads, found once.
A count the user set (either variable) is left as it is.
"""

from __future__ import annotations

import os
import platform

THREAD_VARIABLES = ("TVM_NUM_THREADS", "OMP_NUM_THREADS")


def default_threads(cpus: int, machine: str) -> int:
    """What tvm 0.27's ``MaxConcurrency()`` returns when no variable is set, for ``cpus`` online CPUs."""
    if machine.lower() in ("x86_64", "amd64"):
        cpus //= 2  # tvm's own "ignore hyper-threading" halving (threading_backend.cc)
    return max(cpus, 1)


def fix_thread_count() -> None:
    """Set ``TVM_NUM_THREADS`` to tvm's own default unless the user chose a count (see the module)."""
    if any(name in os.environ for name in THREAD_VARIABLES):  # even empty: tvm reads it (as 1)
        return
    # os.cpu_count() is sysconf(_SC_NPROCESSORS_ONLN): the same online-CPU count hardware_concurrency() reads.
    os.environ["TVM_NUM_THREADS"] = str(default_threads(os.cpu_count() or 1, platform.machine()))
