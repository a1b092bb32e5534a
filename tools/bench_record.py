"""The one shape of a bench's result file, ``docs/bench/<bench>.json``, that ``tools/bench_page.py`` renders.

A bench calls :func:`start` before it runs anything and :func:`write` at the end. The file holds the run (date,
command line, machine, CPU model and the ISA extensions the kernels use, load average before and after, commit),
the bench's own raw results, and ``tables``: what the page shows, each figure a :func:`figure` of its values over
the rounds (median, min, max and the values themselves), so the spread travels with every number and nothing on the
page is typed by hand.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "docs" / "bench"
SCHEMA_VERSION = 1
DATE = "%Y-%m-%d %H:%M:%S UTC"

#: A table cell: text, a plain number, a figure (see :func:`figure`) or nothing.
Cell = str | int | float | dict[str, Any] | None


def figure(values: Sequence[float], digits: int = 4) -> dict[str, Any]:
    """One figure over the rounds: its median, min and max, and every round's value (failed rounds left out)."""
    ok = sorted(float(v) for v in values if v is not None)
    if not ok:
        return {"median": None, "min": None, "max": None, "rounds": []}
    mid = len(ok) // 2
    median = ok[mid] if len(ok) % 2 else (ok[mid - 1] + ok[mid]) / 2
    return {
        "median": round(median, digits),
        "min": round(ok[0], digits),
        "max": round(ok[-1], digits),
        "rounds": [round(float(v), digits) for v in values if v is not None],
    }


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Cell]], note: str = "") -> dict[str, Any]:
    """A table of the page: ``rows`` of cells under ``columns``, with an optional note under it."""
    return {"title": title, "columns": list(columns), "rows": [list(r) for r in rows], "note": note}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The ISA extensions the kernels pick their paths by: a model name alone ("AMD EPYC" in a VM) does not tell them.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8")


def kernel_flags() -> list[str]:
    """Which of :data:`KERNEL_FLAGS` this CPU has, in that order."""
    from aotforge.core.cpu_flags import cpu_flags

    have = cpu_flags()
    return [f for f in KERNEL_FLAGS if f in have]


def _memory_gib() -> float | None:
    try:
        kib = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("Mem"))
    except (OSError, StopIteration, ValueError):
        return None
    return round(kib / 1024**2, 1)


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return done.stdout.strip() or None


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def start(settings: dict[str, Any]) -> dict[str, Any]:
    """The run's record, taken before the bench starts: ``settings`` are its arguments as it understood them."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime(DATE),
        "command": shlex.join(["python", str(shown), *sys.argv[1:]]),
        "commit": _commit(),
        "machine": {
            "cpu_model": cpu_model(),
            "cpus": os.cpu_count(),
            "cpu_flags": kernel_flags(),
            "memory_gib": _memory_gib(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "load_before": _load(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()},
    }


def write(path: Path, bench: str, run: dict[str, Any], tables: list[dict[str, Any]], results: Any) -> Path:
    """Finish ``run`` (load after, seconds) and write the bench's file as sorted-key JSON."""
    started = datetime.datetime.strptime(run["date"], DATE).replace(tzinfo=datetime.UTC)
    minutes = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
    record = {
        "schema_version": SCHEMA_VERSION,
        "bench": bench,
        "run": {**run, "load_after": _load(), "minutes": round(minutes)},
        "tables": tables,
        "results": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    print(f"results: {path} (make bench-page renders docs/benchmarks.md)")
    return path
