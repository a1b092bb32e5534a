"""Back the memory a block of code allocates (a runtime's weights) with transparent huge pages.

A decode step at batch 1 streams every weight once (SmolLM-135M in fp32: 538 MB). On 4 KiB pages that is
~131k pages per step against a few thousand TLB entries, so nearly every page costs a page walk; on 2 MiB
pages, ~270. ONNX Runtime keeps its prepacked weights in plain ``malloc`` memory, which the kernel backs with
huge pages only when asked (``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` on many hosts,
Debian's default among them). So after the sessions open, the anonymous mappings they added are advised
``MADV_HUGEPAGE`` and collapsed in place (``MADV_COLLAPSE``, Linux 6.1+): same bytes, same addresses, no copy
the runtime sees. Best effort: where the kernel cannot (another OS, THP ``never``, an older kernel) the memory
stays as it was and the report says why. Only mappings that appear or change inside the block are seen: in a
process that freed large blocks before, glibc can serve the runtime from heap it had already mapped (a freed
block raises its mmap threshold, up to 32 MiB), and that memory stays on 4 KiB pages (``advised_bytes`` then
falls short of the weights' size).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import mmap
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20
_MAPS = Path("/proc/self/maps")


@dataclasses.dataclass
class HugePageReport:
    """What a ``huge_pages`` block advised: bytes in 2 MiB-aligned ranges, the kernel's refusals, the time."""

    advised_bytes: int = 0
    refused: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    skipped: str = ""  # why nothing was advised (not Linux, no THP)


def anonymous_mappings() -> set[tuple[int, int]]:
    """``(start, end)`` of this process's private writable anonymous mappings (heap included) of a huge page or more."""
    found = set()
    for line in _MAPS.read_text().splitlines():
        fields = line.split()
        path = fields[5] if len(fields) > 5 else ""
        start, end = (int(x, 16) for x in fields[0].split("-"))
        private_rw = fields[1].startswith("rw") and fields[1].endswith("p")
        if private_rw and path in ("", "[heap]") and end - start >= HUGE_PAGE:
            found.add((start, end))
    return found


def huge_bytes(low: int, high: int) -> int:
    """Bytes on transparent huge pages (AnonHugePages, /proc/self/smaps) of the mappings overlapping ``[low, high)``."""
    inside, total = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = start < high and low < end
        elif inside and fields and fields[0] == "AnonHugePages:":
            total += int(fields[1]) * 1024
    return total


def unavailable() -> str:
    """Why this host gives no transparent huge pages ('' where it does)."""
    if not sys.platform.startswith("linux") or not _MAPS.is_file():
        return "not Linux: no /proc/self/maps"
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.is_file() or "[never]" in setting.read_text():
        return "transparent huge pages are off on this host (/sys/kernel/mm/transparent_hugepage/enabled)"
    return ""


def advise(mappings: set[tuple[int, int]], report: HugePageReport, collapse: bool = True) -> None:
    """``MADV_HUGEPAGE`` then (``collapse``) ``MADV_COLLAPSE`` over each mapping's 2 MiB-aligned part."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start, end in sorted(mappings):
        first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if last <= first:
            continue
        report.advised_bytes += last - first if collapse else 0
        steps = (("MADV_HUGEPAGE", MADV_HUGEPAGE), ("MADV_COLLAPSE", MADV_COLLAPSE))
        for name, advice in steps if collapse else steps[:1]:
            if libc.madvise(first, last - first, advice) != 0:  # EINVAL on kernels before 6.1, EAGAIN/ENOMEM if busy
                key = f"{name}: errno {ctypes.get_errno()}"
                report.refused[key] = report.refused.get(key, 0) + 1


def _skip_reason(enabled: bool) -> str:
    return unavailable() if enabled else "not asked"


@contextlib.contextmanager
def huge_pages(enabled: bool = True) -> Iterator[HugePageReport]:
    """Advise the anonymous mappings that appear or change inside the block (``with huge_pages() as report:``):
    for memory a runtime allocates itself (ONNX Runtime's prepacked weights)."""
    report = HugePageReport(skipped=_skip_reason(enabled))
    before = anonymous_mappings() if not report.skipped else set()
    yield report
    if report.skipped:
        return
    started = time.perf_counter()
    advise(anonymous_mappings() - before, report)
    report.seconds = round(time.perf_counter() - started, 3)


@contextlib.contextmanager
def huge_page_region(nbytes: int, enabled: bool, report: HugePageReport) -> Iterator[np.ndarray]:
    """A fresh private anonymous region of ``nbytes`` on a 2 MiB boundary for the block to fill (``with
    huge_page_region(n, True, report) as region:``): for memory we allocate (tvm's weights). Advised onto huge
    pages before it is written, so its page faults take 2 MiB pages; collapsed after for what they did not."""
    report.skipped = _skip_reason(enabled)
    whole = np.frombuffer(mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    region = whole[start : start + nbytes]
    span = {(region.ctypes.data, region.ctypes.data + nbytes)}
    if not report.skipped:
        advise(span, report, collapse=False)
    yield region
    if not report.skipped:
        started = time.perf_counter()
        advise(span, report)
        report.seconds = round(time.perf_counter() - started, 3)
