"""The tvm runtime's thread count pinned in the environment (``targets/tvm/threads``): the physical cores."""

from __future__ import annotations

import os
import platform

import psutil
import pytest

from aotforge.targets.tvm.threads import THREAD_VARIABLES, default_threads, fix_thread_count, tvm_default_threads


def test_tvm_default_threads_is_tvms_own() -> None:
    # tvm 0.27 MaxConcurrency(): hardware_concurrency(), halved on x86-64, at least 1
    assert tvm_default_threads(2, "x86_64") == 1
    assert tvm_default_threads(16, "AMD64") == 8
    assert tvm_default_threads(1, "x86_64") == 1
    assert tvm_default_threads(16, "aarch64") == 16


def test_default_threads_is_one_per_physical_core() -> None:
    assert default_threads(2, 2, "x86_64") == 2  # two cores without SMT: both (tvm's own default took one)
    assert default_threads(8, 16, "x86_64") == 8  # eight cores of two hardware threads
    assert default_threads(8, 4, "x86_64") == 4  # an affinity mask of four CPUs
    assert default_threads(None, 16, "x86_64") == tvm_default_threads(16, "x86_64")  # cores unknown


def _without_thread_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # a copy of the environment: what fix_thread_count sets does not outlive the test
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES})


def test_fix_thread_count_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_thread_variables(monkeypatch)
    fix_thread_count()
    cores, usable = psutil.cpu_count(logical=False), len(os.sched_getaffinity(0))
    assert os.environ["TVM_NUM_THREADS"] == str(default_threads(cores, usable, platform.machine()))


@pytest.mark.parametrize("name", THREAD_VARIABLES)
def test_fix_thread_count_keeps_the_users_count(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    _without_thread_variables(monkeypatch)
    os.environ[name] = "3"
    fix_thread_count()
    assert os.environ[name] == "3"
    assert all(other not in os.environ for other in THREAD_VARIABLES if other != name)
