"""The shared timing cache file: merged, never overwritten, one writer at a time.

Two builds sharing a cache (a build farm, two ``--target tensorrt`` compiles into one cache dir)
each start from the file as it was; writing back their own cache would drop what the other
measured. So the write is read-merge-write under an exclusive lock, as Polygraphy does
(``polygraphy/backend/trt/loader.py``: ``util.LockFile`` around ``timing_cache.combine(prev_cache,
ignore_mismatch=True)``). The merge itself is TensorRT's (:func:`targets.tensorrt.sdk.combine_timing_caches`);
this module is plain Python and tested here with any merge function.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from aotforge.core.file_lock import locked


def merge_into(path: Path, built: bytes, combine: Callable[[bytes, bytes], bytes]) -> bytes:
    """Write ``combine(built, what the file holds now)`` to ``path`` atomically; returns what was written."""
    with locked(path.with_name(path.name + ".lock")):  # a file of its own: the cache itself is replaced
        on_disk = path.read_bytes() if path.exists() else b""
        merged = combine(built, on_disk) if on_disk else built
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(merged)
        partial.replace(path)  # a reader without the lock still never sees half a cache
    return merged
