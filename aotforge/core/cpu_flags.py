"""The kernel's CPU flags for this host, as ``/proc/cpuinfo`` lists them (``flags`` on x86, ``Features`` on Arm)."""

from __future__ import annotations

from pathlib import Path


def cpu_flags() -> set[str]:
    """The first processor's flags; empty where there is no ``/proc``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()
