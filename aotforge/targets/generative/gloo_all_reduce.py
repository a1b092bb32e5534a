"""The ranks' collectives over ``torch.distributed`` gloo: tensor-parallel ranks on several hosts (``ray_ranks.py``).

The same calls as the one-host shared-memory segment (``shm_all_reduce.ShmAllReduce``: the all-reduce, and a
sequence-parallel prefill's reduce-scatter and all-gather), so a rank graph's Python ops call either one
(``targets/onnxruntime/tensor_parallel.register_all_reduce``). Gloo's ring gives every rank the same bits, as the
segment's sums in rank order do. Rank 0 holds the rendezvous store (``torch.distributed.TCPStore``, on a port its
node's kernel picks, so no port is guessed); each rank's gloo device is bound to its Ray node's address, the one the
other nodes reach it by. Gloo has no abort flag: a rank whose peer died fails its collective (a closed connection,
or ``timeout_s``), and the driver kills the group's survivors (``ActorGroup.close``).
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from aotforge.core.errors import RankFailedError


def master_store(host: str, world: int, timeout_s: float) -> Any:
    """Rank 0's rendezvous store on ``host``, on a port of the kernel's choosing (``store.port``)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.TCPStore(host, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)


class GlooAllReduce:
    """Rank ``rank``'s end of the group's collectives: ``store`` is rank 0's own (:func:`master_store`), or
    ``None`` to join the one at ``host:port``; ``device_host`` the address this rank's gloo device binds."""

    def __init__(
        self, store: Any, host: str, port: int, rank: int, world: int, device_host: str, timeout_s: float = 60.0
    ) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
        gloo: Any = dist.ProcessGroupGloo  # (torch's stubs lack its options and collectives)
        options = gloo._Options()
        options._timeout = timeout
        options._devices = [gloo.create_device(hostname=device_host)]
        self.store = store  # rank 0's must live as long as the group
        self.group: Any = gloo(store, rank, world, options)
        self.rank, self.world, self.timeout_s = rank, world, timeout_s

    def _sum(self, x: np.ndarray) -> np.ndarray:
        import torch

        out = np.array(x, dtype=np.float32, order="C", copy=True)
        try:
            self.group.allreduce([torch.from_numpy(out)]).wait()
        except RuntimeError as e:
            raise RankFailedError(
                f"rank {self.rank}: an all-reduce over gloo failed (another rank died, failed or took more than "
                f"{self.timeout_s:.0f} s: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
            ) from None
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self._sum(x)

    def reduce_scatter(self, x: np.ndarray) -> np.ndarray:
        """Rank ``rank``'s positions ``rank*c .. (rank+1)*c`` (``c = ceil(T / world)``) of the sum of ``x [batch,
        T, ...]`` over the ranks, positions past ``T`` zeros (``ShmAllReduce.reduce_scatter``'s result): an
        all-reduce then this rank's rows, since gloo has no reduce-scatter."""
        batch, length = x.shape[:2]
        size = -(-length // self.world)
        total = self._sum(x)
        out = np.zeros((batch, size, *x.shape[2:]), dtype=np.float32)
        mine = total[:, self.rank * size : (self.rank + 1) * size]
        out[:, : mine.shape[1]] = mine
        return out

    def all_gather(self, x: np.ndarray, length: int) -> np.ndarray:
        """Every rank's ``x [batch, c, ...]`` side by side on the sequence axis, cut to ``length`` positions."""
        import torch

        local = np.ascontiguousarray(x, dtype=np.float32)
        parts = [torch.empty(local.shape, dtype=torch.float32) for _ in range(self.world)]
        try:
            self.group.allgather([parts], [torch.from_numpy(local)]).wait()
        except RuntimeError as e:
            raise RankFailedError(f"rank {self.rank}: an all-gather over gloo failed ({e})") from None
        return np.concatenate([p.numpy() for p in parts], axis=1)[:, :length]

    def check(self) -> None:
        """Nothing to look at: a failed collective raised in the call that ran it."""

    def abort(self) -> None:
        """Nothing to set: the driver kills the ranks still waiting in a collective (``ActorGroup.close``)."""

    def close(self) -> None:
        self.group = None
