"""What the Ray tests share: a scenario script (``tests/ray_*.py``) run inside a private network namespace, where
Ray binds and dials loopback only (docs: FACTS, Ray), and whether this host can make one (``SKIP``).

A scenario prints one JSON line last: what its test asserts on. The serving scenarios also take the prompts and
the number of new tokens as a request file, and are compared with the greedy tokens of an artifact's own
``generate``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import ROOT


def _netns_ok() -> str | None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return "needs root, unshare and ip for a private network namespace"
    run = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    return None if run.returncode == 0 else f"unshare -n failed: {run.stderr.strip()}"


#: Why this host cannot run a scenario (None when it can).
SKIP = _netns_ok()


def run_scenario(script: str, *args: object, timeout: float = 1200) -> dict[str, Any]:
    """``python tests/SCRIPT ARGS...`` in a network namespace of its own, loopback up; its last line's JSON."""
    command = " ".join([sys.executable, str(ROOT / "tests" / script), *(str(a) for a in args)])
    run = subprocess.run(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {command}"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def greedy(artifact: Path, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Each prompt's ``new`` greedy tokens from the artifact's own ``generate``, one prompt at a time."""
    import aotforge

    loaded = aotforge.load(artifact)
    return [loaded.generate(np.array([p]), new, ignore_eos=True)[0, len(p) :].tolist() for p in prompts]


def serving_scenario(
    script: str, work: Path, artifact: Path, reference: Path, prompts: list[list[int]], new: int, *extra: str
) -> tuple[dict[str, Any], list[list[int]]]:
    """``script WORK ARTIFACT REQUEST_JSON EXTRA...`` run on ``prompts``: its JSON, and ``reference``'s greedy tokens
    (what the scenario's serving must give)."""
    want = greedy(reference, prompts, new)
    (work / "request.json").write_text(json.dumps({"prompts": prompts, "new": new}))
    return run_scenario(script, work, artifact, work / "request.json", *extra), want
