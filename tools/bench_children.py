"""What the benchmarks that time each runtime in a process of its own share: starting a child, reading its result.

A child prints its result as one line ``RESULT {json}``; anything else it prints (progress, warnings) is ignored.
A child that fails returns ``{"error": [its last stderr lines]}`` so one failed round does not end the bench.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

PREFIX = "RESULT "


def run_child(cmd: list[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` and return the JSON of its last ``RESULT`` line, or its error."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(PREFIX)]
    return json.loads(lines[-1][len(PREFIX) :]) if lines else {"error": done.stderr.strip().splitlines()[-3:]}


def median_of(runs: list[dict[str, Any]], digits: int = 4) -> dict[str, Any]:
    """Each numeric field's median over the runs that did not fail (the last failure if all did)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    merged: dict[str, Any] = dict(ok[-1])
    for key, value in ok[-1].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            merged[key] = round(float(np.median([r[key] for r in ok])), digits)
    merged["rounds"] = len(ok)
    return merged


def built_artifact(out: Path, name: str, target: str) -> str | None:
    """The newest version of artifact ``name`` for ``target`` under ``out`` (a registry), if one was built: a bench
    builds each artifact once, its later runs and rounds load it."""
    done = sorted((out / name).glob(f"*/{target}/manifest.json"), key=lambda p: int(p.parts[-3]))
    return str(done[-1].parent) if done else None


def text_generation_artifact(model_dir: Path, out: Path, name: str, target: str, **options: Any) -> str:
    """Artifact ``name`` for ``target`` under ``out``: the one built before (``built_artifact``), else the causal
    LM at ``model_dir`` built as a text-generation artifact with ``options``, without the benchmark (the bench
    times it)."""
    done = built_artifact(out, name, target)
    if done is not None:
        return done
    import aotforge

    built = aotforge.build(model_dir, target=target, task="text-generation", out=out, name=name, bench=False, **options)
    return str(built.path)
