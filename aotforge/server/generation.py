"""One request's life in the engine as the HTTP layer sees it: opened (errors become HTTP errors before any byte
is sent), read to the end or streamed as server-sent events, and aborted when the client goes away."""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from aotforge.core.errors import AotforgeError, EngineBusyError, describe
from aotforge.runtime.outputs import FinishReason, RequestOutput
from aotforge.runtime.params import SamplingParams
from aotforge.server.protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger("aotforge.server")

#: What a 429 tells the client to wait before retrying, in seconds.
RETRY_AFTER_S = 1


class ApiError(Exception):
    """An answer in OpenAI's error shape: status, message, type, param, code (and headers, e.g. Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers
        self.body = ErrorResponse(error=ErrorInfo(message=message, type=type_, param=param, code=code))


def runner_fault(message: str | None) -> ApiError:
    """The engine's message of a runner fault on this request's step (it names the runner's error)."""
    return ApiError(500, message or "the model runner failed on this request", "server_error", code="runner_error")


class Generation:
    """A request the engine accepted: its first output already in hand, the rest on :meth:`outputs`."""

    def __init__(self, engine: Any, request_id: str, outputs: Any, first: RequestOutput) -> None:
        self.engine, self.request_id, self._it = engine, request_id, outputs
        self.first = self.last = first

    @classmethod
    async def open(cls, engine: Any, request_id: str, prompt: list[int], params: SamplingParams) -> Generation:
        """Submit the request and wait for its first output, so that a refusal (queue full, too long) or a fault
        on its prefill is an HTTP error, not a broken stream."""
        try:
            outputs = engine.generate(request_id, prompt, params)
            if inspect.isawaitable(outputs):
                outputs = await outputs
            first = await anext(outputs)
        except EngineBusyError as e:
            raise ApiError(
                429, str(e), "rate_limit_error", code="engine_busy", headers={"Retry-After": str(RETRY_AFTER_S)}
            ) from e
        except AotforgeError as e:
            raise ApiError(400, str(e)) from e
        generation = cls(engine, request_id, outputs, first)
        if first.finish_reason == FinishReason.ERROR:
            await generation.close()
            raise runner_fault(first.error)
        return generation

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        yield self.first
        while not self.last.finished:
            self.last = await anext(self._it)
            yield self.last

    async def close(self) -> None:
        """Close the engine's iterator, which aborts the request if it has not finished (the client went away)."""
        aclose: Callable[[], Any] | None = getattr(self._it, "aclose", None)
        if aclose is None:
            if not self.last.finished:
                self.engine.abort(self.request_id)
            return
        with anyio.CancelScope(shield=True):  # this runs while a disconnect cancels the response
            await aclose()


class EventStream(StreamingResponse):
    """Server-sent events from a :class:`Generation`, which is closed however the stream ends: finished, the client
    disconnected (Starlette cancels the sending task), or the server shutting down past its drain deadline."""

    def __init__(self, generation: Generation, events: AsyncIterator[str]) -> None:
        super().__init__(guarded(events), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.generation.close()


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


def sse_error(error: ApiError) -> str:
    """A fault after the 200 went out: the error as one event (the openai client raises it), then ``[DONE]``."""
    return sse(error.body.model_dump_json())


DONE = sse("[DONE]")


def internal_error(e: BaseException) -> ApiError:
    return ApiError(500, f"internal error: {type(e).__name__}: {describe(e)}", "server_error", code="internal_error")


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream whose engine fails after the 200 went out still ends as a stream: the error event, ``[DONE]``."""
    try:
        async for event in events:
            yield event
    except Exception as e:  # a bug below us; the client gets its one clear answer, the log the traceback
        logger.exception("the stream failed")
        yield sse_error(internal_error(e))
        yield DONE
