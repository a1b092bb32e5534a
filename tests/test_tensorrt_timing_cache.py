"""The shared timing cache is merged under a lock, never overwritten (targets/tensorrt/timing_cache.py).

TensorRT's merge (``ITimingCache.combine``) needs the SDK; here a set union of lines stands in for it,
so what is tested is the read-merge-write and its lock across real processes, not TensorRT.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from aotforge.targets.tensorrt.timing_cache import merge_into


def _union(built: bytes, on_disk: bytes) -> bytes:
    return b"".join(sorted(set(built.splitlines(keepends=True)) | set(on_disk.splitlines(keepends=True))))


def _build(path: str, n: int) -> None:
    merge_into(Path(path), f"tactic-{n}\n".encode(), _union)


def test_a_second_build_keeps_what_the_first_wrote(tmp_path: Path) -> None:
    cache = tmp_path / "timing" / "trt.cache"
    assert merge_into(cache, b"a\n", _union) == b"a\n"  # first build: nothing to merge with
    merge_into(cache, b"b\n", _union)
    assert cache.read_bytes() == b"a\nb\n"
    assert sorted(p.name for p in cache.parent.iterdir()) == ["trt.cache", "trt.cache.lock"]


def test_concurrent_builds_lose_no_entry(tmp_path: Path) -> None:
    cache = tmp_path / "trt.cache"
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_build, args=(str(cache), n)) for n in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert all(w.exitcode == 0 for w in workers)
    assert cache.read_bytes().splitlines() == [f"tactic-{n}".encode() for n in range(6)]
