"""``AOTFORGE_REQUIRE`` (tests/conftest.py) turns a device test's probe skip into a failure.

Each case runs pytest for real in a subprocess on the two device tests that skip on this host, so
what is checked is exactly what ``make device-check`` sees: the exit status and the outcome lines.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aotforge.targets import get_target
from tests.conftest import ROOT

TRT_E2E = "tests/test_tensorrt_target.py::test_end_to_end_engine_builds_loads_and_matches_ort"
NEURON_E2E = "tests/test_neuron_target.py::test_end_to_end_on_a_neuron_device"


def _pytest(require: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AOTFORGE_REQUIRE"}
    if require is not None:
        env["AOTFORGE_REQUIRE"] = require
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-m", "gpu or neuron"]
    return subprocess.run(
        [*command, TRT_E2E, NEURON_E2E], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _outcome(out: str, test: str) -> str:
    """The -rA summary word (PASSED / FAILED / SKIPPED) for ``test``."""
    # Skips are summarized by file and line, not node id: match on the file for those.
    for line in out.splitlines():
        word = line.split(" ", 1)[0]
        if word in ("PASSED", "FAILED", "SKIPPED", "ERROR") and (test in line or test.split("::")[0] in line):
            return word
    raise AssertionError(f"no outcome for {test} in:\n{out}")


@pytest.mark.parametrize(
    ("require", "rc", "trt", "neuron"),
    [
        (None, 0, "SKIPPED", "SKIPPED"),
        ("tensorrt", 1, "FAILED", "SKIPPED"),
        ("neuron", 1, "SKIPPED", "FAILED"),
    ],
    ids=["unset", "tensorrt", "neuron"],
)
def test_require_fails_only_the_required_targets_skips(require: str | None, rc: int, trt: str, neuron: str) -> None:
    if get_target("tensorrt").probe().available or get_target("neuron").probe().available:
        pytest.skip("a device target runs on this host, so its end-to-end test does not skip")
    run = _pytest(require)
    out = run.stdout + run.stderr
    assert run.returncode == rc, out
    assert (_outcome(out, TRT_E2E), _outcome(out, NEURON_E2E)) == (trt, neuron), out
    if trt == "FAILED":
        # The failure carries the probe's own reason: what the host lacks, by name.
        assert "AOTFORGE_REQUIRE asks for the gpu tests to run, but: tensorrt needs, and this host lacks" in out


def test_an_unknown_require_value_is_a_usage_error() -> None:
    run = _pytest("tensorrtt")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "AOTFORGE_REQUIRE=tensorrtt is unknown; use tensorrt or neuron" in run.stderr
