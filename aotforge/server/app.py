"""The OpenAI-compatible HTTP API over one :class:`~aotforge.runtime.async_engine.AsyncEngine`.

``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true`` as server-sent
events ending in ``data: [DONE]``), ``GET /health`` and ``GET /metrics``. Every error is OpenAI's error JSON;
a malformed body is a 400 naming the field (as vLLM answers, not FastAPI's 422).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from aotforge.runtime.outputs import FinishReason, RequestOutput
from aotforge.runtime.params import DRAIN_TIMEOUT_S
from aotforge.server.generation import (
    DONE,
    ApiError,
    EventStream,
    Generation,
    internal_error,
    runner_fault,
    sse,
    sse_error,
)
from aotforge.server.metrics import CountResponses, ServerMetrics
from aotforge.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Delta,
    ModelCard,
    ModelList,
    Usage,
)

#: OpenAI's default ``max_tokens`` of a completion; a chat completion defaults to the rest of the context.
COMPLETION_MAX_TOKENS = 16


def build_app(
    engine: Any,
    *,
    api_key: str | None = None,
    served_model_name: str | None = None,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
) -> FastAPI:
    """The app serving ``engine`` (started with the app, drained for up to ``drain_timeout_s`` when it stops)
    as ``served_model_name`` (default: the artifact's name); ``api_key`` makes ``/v1/*`` ask for a Bearer key."""
    name = served_model_name or engine.model_name
    metrics = ServerMetrics(name)
    engine.add_listener(metrics.observe)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        await engine.shutdown(drain_timeout_s)

    app = FastAPI(title="aotforge", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics
    app.add_middleware(CountResponses, metrics=metrics)
    _handle_errors(app)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.include_router(_api(engine, name, api_key))
    return app


def _api(engine: Any, name: str, api_key: str | None) -> APIRouter:
    async def authorized(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401, "missing API key: send `Authorization: Bearer KEY`", "authentication_error", code="invalid_api_key"
            )
        if not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "wrong API key", "authentication_error", code="invalid_api_key")

    def served(model: str) -> None:
        if model != name:
            raise ApiError(
                404,
                f"model {model!r} is not served here; this server serves {name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    router = APIRouter(prefix="/v1", dependencies=[Depends(authorized)])

    @router.get("/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, max_model_len=engine.max_model_len)])

    @router.post("/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> CompletionResponse | EventStream:
        served(body.model)
        prompt = _encode(engine, body.prompt)
        params = body.sampling_params(body.max_tokens or COMPLETION_MAX_TOKENS)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        generation = await Generation.open(engine, request_id, prompt, params)
        if body.stream:
            events = _completion_events(generation, name, body.include_usage, body.return_token_ids)
            return EventStream(generation, events)
        text, ids, last = await _collect(generation, request)
        choice = CompletionChoice(
            text=text, finish_reason=_reason(last), token_ids=ids if body.return_token_ids else None
        )
        return CompletionResponse(id=request_id, model=name, choices=[choice], usage=_usage(last))

    @router.post("/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> ChatCompletionResponse | EventStream:
        served(body.model)
        prompt = _chat_prompt(engine, name, body)
        max_tokens = body.requested_max_tokens or max(1, engine.max_model_len - len(prompt) + 1)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        generation = await Generation.open(engine, request_id, prompt, body.sampling_params(max_tokens))
        if body.stream:
            return EventStream(generation, _chat_events(generation, name, body.include_usage))
        text, _, last = await _collect(generation, request)
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=_reason(last))
        return ChatCompletionResponse(id=request_id, model=name, choices=[choice], usage=_usage(last))

    return router


def _encode(engine: Any, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    if engine.tokenizer is None:
        raise ApiError(
            400, f"{engine.model_name} carries no tokenizer: send the prompt as a list of token ids", param="prompt"
        )
    return list(engine.tokenizer(prompt)["input_ids"])


def _chat_prompt(engine: Any, name: str, body: ChatCompletionRequest) -> list[int]:
    if engine.tokenizer is None or not engine.chat_template:
        raise ApiError(
            400,
            f"{name} has no chat template (its model directory carried none): use /v1/completions",
            param="messages",
            code="no_chat_template",
        )
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        text = engine.tokenizer.apply_chat_template(
            messages, chat_template=engine.chat_template, add_generation_prompt=True, tokenize=False
        )
    except Exception as e:  # the template's own checks (jinja2's raise_exception) reject these messages
        raise ApiError(400, f"the chat template rejects these messages: {e}", param="messages") from e
    return list(engine.tokenizer(text, add_special_tokens=False)["input_ids"])


async def _collect(generation: Generation, request: Request) -> tuple[str, list[int], RequestOutput]:
    """A whole answer; the request is aborted if the client disconnects before it is done."""
    text: list[str] = []
    ids: list[int] = []
    try:
        async for out in generation.outputs():
            text.append(out.text)
            ids += out.token_ids
            if not out.finished and await request.is_disconnected():
                break
    finally:
        await generation.close()
    last = generation.last
    if last.finish_reason == FinishReason.ERROR:
        raise runner_fault(last.error)
    return "".join(text), ids, last


async def _completion_events(
    generation: Generation, model: str, include_usage: bool, return_ids: bool
) -> AsyncIterator[str]:
    rid = generation.request_id
    async for out in generation.outputs():
        if out.finish_reason == FinishReason.ERROR:
            yield sse_error(runner_fault(out.error))
            break
        if out.token_ids or out.finished:  # a token without text yet (half a character) is still a chunk
            ids = list(out.token_ids) if return_ids else None
            choice = CompletionChoice(text=out.text, finish_reason=_reason(out), token_ids=ids)
            yield sse(CompletionResponse(id=rid, model=model, choices=[choice]).model_dump_json())
    else:
        if include_usage:
            yield sse(
                CompletionResponse(id=rid, model=model, choices=[], usage=_usage(generation.last)).model_dump_json()
            )
    yield DONE


async def _chat_events(generation: Generation, model: str, include_usage: bool) -> AsyncIterator[str]:
    rid = generation.request_id

    def chunk(delta: Delta, finish_reason: str | None = None) -> str:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
        return sse(ChatCompletionChunk(id=rid, model=model, choices=[choice]).model_dump_json(exclude_none=True))

    yield chunk(Delta(role="assistant", content=""))
    async for out in generation.outputs():
        if out.finish_reason == FinishReason.ERROR:
            yield sse_error(runner_fault(out.error))
            break
        if out.token_ids or out.finished:
            yield chunk(Delta(content=out.text), _reason(out))
    else:
        if include_usage:
            usage = ChatCompletionChunk(id=rid, model=model, choices=[], usage=_usage(generation.last))
            yield sse(usage.model_dump_json())
    yield DONE


def _reason(out: RequestOutput) -> str | None:
    return None if out.finish_reason is None else FinishReason(out.finish_reason).value


def _usage(last: RequestOutput) -> Usage:
    return Usage.of(last.prompt_tokens, last.completion_tokens)


def _handle_errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape: ours, FastAPI's body validation (400 naming the field), Starlette's 404/405,
    and a bug (500; Starlette still logs its traceback)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body.model_dump(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, e: RequestValidationError) -> JSONResponse:
        return await api_error(request, _validation_error(e))

    @app.exception_handler(Exception)
    async def bug(request: Request, e: Exception) -> JSONResponse:
        return await api_error(request, internal_error(e))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return await api_error(
            request, ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind)
        )


def _validation_error(e: RequestValidationError) -> ApiError:
    first = e.errors()[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    path = [str(p) for p in first["loc"] if p != "body"]
    if not path and first["type"] in ("model_attributes_type", "dict_type"):
        return ApiError(400, "the request body must be a JSON object (with Content-Type: application/json)")
    field = ".".join(path) if path else None
    message = first["msg"].removeprefix("Value error, ")
    where = f"{field}: " if field else "the request body: "
    return ApiError(400, where + message, param=path[0] if path else None, code="invalid_value")
