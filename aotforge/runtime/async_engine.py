"""The engine on a thread of its own, for asyncio clients (the server): submit, stream, abort, drain.

The step loop runs on one thread (the runners' calls release the GIL while they compute); requests and
aborts reach it through a locked inbox, its outputs reach each request's ``asyncio.Queue`` through the
event loop's ``call_soon_threadsafe``, once a step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aotforge.core.errors import EngineBusyError, InputSpecError
from aotforge.runtime.engine import LLMEngine
from aotforge.runtime.outputs import FinishReason, RequestOutput, StepStats
from aotforge.runtime.params import DRAIN_TIMEOUT_S, SamplingParams


class AsyncEngine:
    def __init__(self, engine: LLMEngine, model_name: str, chat_template: str | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_model_len = engine.max_model_len
        self.tokenizer = engine.tokenizer
        self.chat_template = chat_template
        self._listeners: list[Callable[[StepStats], None]] = []
        self._lock = threading.Condition()
        self._inbox: list[tuple[str, Any]] = []
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput]]] = {}
        self._pending = 0  # requests added to the inbox, not yet in the engine
        self._accepting = True
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- the asyncio side ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the step thread and return once it has warmed the runner up (every decode width once).

        The warm-up runs on the step thread, as every later call into the runner does: tvm keeps a thread pool per
        calling thread, its workers pinned to the same cores, so a pool made by a warm-up on the caller's thread
        would keep a second worker spinning on the core of the step thread's own worker as the first requests run.
        """
        if self._thread is None:
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._thread = threading.Thread(
                target=self._warm_then_loop, args=(ready,), name="aotforge-engine", daemon=True
            )
            self._thread.start()
            try:
                ready.result()
            except BaseException:
                self._thread.join()
                self._thread = None
                raise

    def add_listener(self, fn: Callable[[StepStats], None]) -> None:
        self._listeners.append(fn)

    def stats(self) -> StepStats:
        return self.engine.last_stats

    async def generate(
        self, request_id: str | None, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Each update of the request until it finishes; closing the iterator early aborts the request."""
        request_id = request_id or uuid.uuid4().hex
        self.engine.check_request(prompt_token_ids, params)
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        with self._lock:
            if not self._accepting:
                raise EngineBusyError("the server is shutting down: send the request to another replica")
            waiting = self.engine.num_waiting + self._pending
            if waiting >= self.engine.config.max_waiting:
                raise EngineBusyError(
                    f"{waiting} requests are waiting already (--max-waiting {self.engine.config.max_waiting}): "
                    "retry later"
                )
            if request_id in self._queues:
                raise InputSpecError(f"request id {request_id!r} is already in use")
            self._queues[request_id] = (asyncio.get_running_loop(), queue)
            self._inbox.append(("add", (request_id, list(prompt_token_ids), params)))
            self._pending += 1
            self._lock.notify()
        finished = False
        try:
            while not finished:
                output = await queue.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._inbox.append(("abort", request_id))
            self._lock.notify()

    async def shutdown(self, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Stop admitting; let running and waiting requests finish up to the deadline, then abort the rest."""
        with self._lock:
            self._accepting = False
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline and (self._queues or self._pending):
            await asyncio.sleep(0.05)
        with self._lock:
            self._inbox += [("abort", rid) for rid in list(self._queues)]
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)

    # -- the engine thread ---------------------------------------------------------------------------------

    def _warm_then_loop(self, ready: concurrent.futures.Future[None]) -> None:
        try:
            self.engine.warmup()
        except BaseException as e:
            ready.set_exception(e)
            return
        ready.set_result(None)
        self._loop()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._inbox and not self.engine.has_unfinished() and not self._stopping:
                    self._lock.wait()
                inbox, self._inbox = self._inbox, []
                stopping = self._stopping
            outputs = [o for item in inbox if (o := self._take(item)) is not None]
            stepped = bool(outputs) or self.engine.has_unfinished()
            if self.engine.has_unfinished():
                outputs += self.engine.step()
            elif outputs:
                self.engine._finish_stats()  # aborts alone still change the gauges
            self._deliver(outputs)
            if stepped:  # each step's statistics reach the listeners once
                for listener in self._listeners:
                    listener(self.engine.last_stats)
            if stopping and not self.engine.has_unfinished():
                return

    def _take(self, item: tuple[str, Any]) -> RequestOutput | None:
        kind, payload = item
        if kind == "abort":
            return self.engine.abort(payload)
        request_id, prompt, params = payload
        with self._lock:
            self._pending -= 1
        try:
            self.engine.add_request(request_id, prompt, params)
        except InputSpecError as e:
            return RequestOutput(request_id, (), "", True, FinishReason.ERROR, len(prompt), 0, error=str(e))
        return None

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """The step's outputs into their requests' queues, waking each event loop once a step however many of
        its requests the step served (each wake-up writes to the loop's self-pipe and takes the GIL from a step
        thread that has more to do)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[RequestOutput], RequestOutput]]] = {}
        with self._lock:
            for output in outputs:
                target = self._queues.get(output.request_id)
                if target is None:
                    continue
                if output.finished:
                    del self._queues[output.request_id]
                loop, queue = target
                by_loop.setdefault(loop, []).append((queue, output))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: its requests' consumers are gone
                pass


def _put_all(items: list[tuple[asyncio.Queue[RequestOutput], RequestOutput]]) -> None:
    for queue, output in items:
        queue.put_nowait(output)
