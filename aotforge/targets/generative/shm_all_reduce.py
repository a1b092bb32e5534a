"""A shared-memory all-reduce for the ranks of one host (vLLM's CPU ``shm`` all-reduce, in numpy).

One segment holds, per rank, an arrival counter, and two banks of one buffer per rank: a call writes its
rank's buffer of bank ``seq % 2``, publishes ``seq``, waits until every rank has published it and sums
the buffers in rank order, so every rank gets the same bits (the replicated residual stream stays
identical). Two banks make one barrier a call enough: a rank that is one call ahead writes the other
bank, and it cannot be two ahead, because that needs everyone's arrival at the call in between. Inputs
larger than a buffer go through in chunks. An ``abort`` flag set by the driver (a rank died) or by a
failing rank makes every waiting rank raise instead of spinning forever.

A sequence-parallel prefill's reduce-scatter and all-gather go over the same banks and counters, in whole rows of
the sequence axis: the reduce-scatter sums only the rank's own rows (in rank order, so they carry the bits the
all-reduce would give them), the all-gather copies every rank's rows to their places.
"""

from __future__ import annotations

import os
import time
from multiprocessing import shared_memory

import numpy as np

from aotforge.core.errors import RankFailedError

_HEADER = 4096  # abort flag and counters; the buffers start page-aligned after it
#: Spins between looks at the abort flag and the clock, and before yielding the core (the peer may need it).
_SPINS = 256


def segment_bytes(world: int, capacity: int) -> int:
    """Bytes of the segment for ``world`` ranks and buffers of ``capacity`` floats."""
    return _HEADER + 2 * world * capacity * 4


class ShmAllReduce:
    """Rank ``rank``'s end of the all-reduce over the segment named ``name``."""

    def __init__(self, name: str, rank: int, world: int, capacity: int, timeout_s: float = 60.0) -> None:
        self.shm = shared_memory.SharedMemory(name=name)
        self.rank, self.world, self.capacity, self.timeout_s = rank, world, capacity, timeout_s
        self.flags = np.ndarray((1 + world,), dtype=np.int64, buffer=self.shm.buf)  # [abort, counter per rank]
        self.banks = np.ndarray((2, world, capacity), dtype=np.float32, buffer=self.shm.buf, offset=_HEADER)
        self.seq = int(self.flags[1 + rank])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        out = np.empty_like(flat)
        for start in range(0, flat.size, self.capacity):
            stop = min(start + self.capacity, flat.size)
            self.seq += 1
            bank = self.banks[self.seq % 2]
            bank[self.rank, : stop - start] = flat[start:stop]
            self.flags[1 + self.rank] = self.seq  # x86 keeps store order: the data is visible before the count
            self._wait(self.seq)
            np.sum(bank[:, : stop - start], axis=0, out=out[start:stop])
        return out.reshape(x.shape)

    def _publish(self, rows: np.ndarray) -> np.ndarray:
        """Write ``rows [k, inner]`` into this rank's buffer of the next bank, wait for every rank's, and return
        the bank's ``[world, k, inner]`` view."""
        k, inner = rows.shape
        self.seq += 1
        bank = self.banks[self.seq % 2][:, : k * inner].reshape(self.world, k, inner)
        bank[self.rank] = rows
        self.flags[1 + self.rank] = self.seq
        self._wait(self.seq)
        return bank

    def _chunk_rows(self, inner: int) -> int:
        if inner > self.capacity:
            raise RankFailedError(f"rank {self.rank}: a row of {inner} floats exceeds the {self.capacity}-float buffer")
        return self.capacity // inner

    def reduce_scatter(self, x: np.ndarray) -> np.ndarray:
        """Rank ``rank``'s positions ``rank*c .. (rank+1)*c`` (``c = ceil(T / world)``) of the sum of ``x [batch,
        T, ...]`` over the ranks; positions past ``T`` are zeros."""
        batch, length = x.shape[:2]
        size = -(-length // self.world)
        rows = np.ascontiguousarray(x, dtype=np.float32).reshape(batch * length, -1)
        out = np.zeros((batch * size, rows.shape[1]), dtype=np.float32)
        step = self._chunk_rows(rows.shape[1])
        for start in range(0, len(rows), step):
            at = np.arange(start, min(start + step, len(rows)))
            bank = self._publish(rows[at])
            b, t = np.divmod(at, length)
            mine = (t >= self.rank * size) & (t < (self.rank + 1) * size)
            out[b[mine] * size + t[mine] - self.rank * size] = np.sum(bank[:, mine], axis=0)
        return out.reshape(batch, size, *x.shape[2:])

    def all_gather(self, x: np.ndarray, length: int) -> np.ndarray:
        """Every rank's ``x [batch, c, ...]`` side by side on the sequence axis, cut to ``length`` positions."""
        batch, size = x.shape[:2]
        rows = np.ascontiguousarray(x, dtype=np.float32).reshape(batch * size, -1)
        out = np.empty((batch * length, rows.shape[1]), dtype=np.float32)
        step = self._chunk_rows(rows.shape[1])
        for start in range(0, len(rows), step):
            at = np.arange(start, min(start + step, len(rows)))
            bank = self._publish(rows[at])
            b, i = np.divmod(at, size)
            for r in range(self.world):
                t = r * size + i
                real = t < length
                out[b[real] * length + t[real]] = bank[r, real]
        return out.reshape(batch, length, *x.shape[2:])

    def _wait(self, seq: int) -> None:
        counters = self.flags[1:]
        deadline = 0.0
        while True:
            for _ in range(_SPINS):
                if counters.min() >= seq:
                    return
            if self.flags[0]:
                raise RankFailedError(f"rank {self.rank}: another rank failed during an all-reduce")
            now = time.monotonic()
            deadline = deadline or now + self.timeout_s
            if now > deadline:
                self.abort()
                raise RankFailedError(
                    f"rank {self.rank}: the other ranks did not reach all-reduce {seq} within {self.timeout_s:.0f} s"
                )
            os.sched_yield()

    def check(self) -> None:
        """Raise if the group's all-reduces were abandoned (a rank failed, or one gave up waiting)."""
        if self.flags[0]:
            raise RankFailedError(
                f"rank {self.rank}: an all-reduce was abandoned (another rank failed, or one waited "
                f"{self.timeout_s:.0f} s for the others)"
            )

    def abort(self) -> None:
        """Make every rank waiting in (or entering) an all-reduce raise."""
        self.flags[0] = 1

    def close(self) -> None:
        del self.flags, self.banks
        self.shm.close()


def create_segment(world: int, capacity: int) -> shared_memory.SharedMemory:
    """The driver's segment (zeroed by the OS); it unlinks it when the ranks stop."""
    return shared_memory.SharedMemory(create=True, size=segment_bytes(world, capacity))


def abort_segment(segment: shared_memory.SharedMemory) -> None:
    """Set the segment's abort flag from outside the ranks (the driver, when a rank died)."""
    np.ndarray((1,), dtype=np.int64, buffer=segment.buf)[0] = 1
