"""The worker processes of a sharded artifact (tensor-parallel ranks, pipeline stages) and the pipes to them.

Each worker is a process of its own with a duplex pipe from the driver: it loads its part, answers ``("ok",
None)`` or ``("error", why)``, then serves ``(where, method, args)`` calls until the driver hangs up. Workers are
forked from a clean server process (never from the driver, whose thread pools may be running) that has imported
``preload`` once (the target's shard module, its runtime's imports). Python starts one such server a process, with
the first group's ``preload``; a later group's other modules import in each of its workers (a target's shard modules
share their imports, so that costs milliseconds). A worker that dies or
fails fails the call at once, whichever worker it is (the others may be waiting for it), stops the group and
leaves :attr:`failed` saying why; every later call raises that, until the owner starts a new group.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from aotforge.core.errors import RankFailedError, describe


class ProcessGroup:
    """``len(args)`` workers running ``main(conn, *args[i])``, named ``f"{kind} {i}"`` in errors."""

    def __init__(
        self,
        kind: str,
        main: Callable[..., None],
        args: Sequence[tuple[Any, ...]],
        preload: Sequence[str],
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self.kind, self.size, self.on_failure = kind, len(args), on_failure
        self.failed = ""
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(preload))
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for worker_args in args:
            here, there = context.Pipe()
            proc = context.Process(target=main, args=(there, *worker_args), daemon=True)
            proc.start()
            there.close()
            self.conns.append(here)
            self.procs.append(proc)

    def send(self, message: Any, order: Sequence[int] | None = None) -> None:
        """``message`` to every worker (in ``order``, default first to last)."""
        if self.failed:
            raise RankFailedError(self.failed)
        for i in range(self.size) if order is None else order:
            try:
                self.conns[i].send(message)
            except OSError:
                self.fail(f"{self.kind} {i}: its pipe is closed")

    def gather(self, stop_at_error: bool = False) -> list[Any]:
        """Each worker's reply. A worker that dies meanwhile fails the call at once; one that answers with an
        error fails it once every worker answered, or at once with ``stop_at_error`` (its neighbours may wait on
        it forever)."""
        results: list[Any] = [None] * self.size
        errors: list[str] = []
        pending = set(range(self.size))
        while pending:
            handles = {self.conns[i]: i for i in pending} | {self.procs[i].sentinel: i for i in pending}
            for i in sorted({handles[h] for h in multiprocessing.connection.wait(list(handles))}):
                try:
                    status, value = self.conns[i].recv()  # what a worker sent before it died is still read
                except (EOFError, OSError):
                    self.procs[i].join(timeout=5)
                    self.fail(f"{self.kind} {i}: its process exited with code {self.procs[i].exitcode}")
                pending.discard(i)
                if status == "ok":
                    results[i] = value
                else:
                    errors.append(f"{self.kind} {i}: {value}")
                    if stop_at_error:
                        break
            if errors and (stop_at_error or not pending):
                self.fail("; ".join(errors))
        return results

    def call(self, message: Any, order: Sequence[int] | None = None, stop_at_error: bool = False) -> list[Any]:
        self.send(message, order)
        return self.gather(stop_at_error)

    def fail(self, why: str) -> NoReturn:
        """Stop the group (``on_failure`` first: the survivors stop waiting) and raise why."""
        self.on_failure()
        self.failed = why
        self.close()
        raise RankFailedError(why)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for proc in self.procs:  # a worker blocked on a dead neighbour sees its pipe close and exits
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.conns, self.procs = [], []

    def __del__(self) -> None:
        if self.procs:
            self.close()


class GroupEngine:
    """The driver's end of a worker group, restarting it when it fails.

    Every call goes through :meth:`call`. A failed call starts a new group (and in it the serving runner and
    the KV pool the old one had, empty) before it raises, so the call's requests fail and the next ones run;
    the serving engine drops its prefix cache with the lost pool (``runtime/engine.py``).
    """

    group: Any

    def __init__(self) -> None:
        self.runner_rows = 0  # the serving runner's rows, once one was made
        self.pool: tuple[int, int] | None = None  # its (num_blocks, block_size), once allocated

    def start_group(self) -> Any:
        raise NotImplementedError

    def call(self, where: str, method: str, *args: Any) -> Any:
        try:
            return self.group.call(where, method, *args)
        except RankFailedError as e:
            raise RankFailedError(f"{e}; {self._restart()}") from e

    def submit(self, where: str, method: str, *args: Any) -> None:
        """:meth:`call`'s first half: send the call and return (a worker answers its calls in order)."""
        try:
            self.group.submit(where, method, *args)
        except RankFailedError as e:
            raise RankFailedError(f"{e}; {self._restart()}") from e

    def collect(self) -> Any:
        """:meth:`call`'s second half: the result of the oldest call submitted."""
        try:
            return self.group.collect()
        except RankFailedError as e:
            raise RankFailedError(f"{e}; {self._restart()}") from e

    def _restart(self) -> str:
        """Start a new group like the failed one; what the failed requests' error adds."""
        self.group.close()
        try:
            self.group = self.start_group()
            if self.runner_rows:
                self.group.call("new_runner", "", self.runner_rows)
            if self.pool:
                self.group.call("runner", "allocate", *self.pool)
        except Exception as e:  # whatever stops the new group (a rank's load, a fork), the caller's error says it
            why = describe(e, last=True)
            return f"restarting the group failed too ({why}): restart the server or reload the artifact"
        return "the group was restarted with an empty KV cache, and the next requests run"

    def close(self) -> None:
        self.group.close()
