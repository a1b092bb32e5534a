"""OpenAI's completions and chat-completions bodies as pydantic models: what a request may say, what we answer.

Fields we do not honour are refused by name (never silently ignored when set to something other than their
default); fields OpenAI clients send that change nothing (``user``) are accepted. ``top_k``, ``ignore_eos`` and
``stop_token_ids`` are extensions, as in vLLM.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from aotforge.runtime.params import SamplingParams

#: Request fields we do not implement -> the values that mean "not asked for" (anything else is refused).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    """What completions and chat completions share: the model and the sampling settings."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    #: the generated token ids on each choice (``token_ids``), as vLLM's extension of the same name
    return_token_ids: bool = False
    n: int = 1

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, defaults in UNSUPPORTED.items():
                if name in data and data[name] not in defaults:
                    raise ValueError(f"{name} is not supported by aotforge serve: leave it out")
        return data

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(f"n must be 1 (one choice per request), got {n}: send {n} requests instead")
        return n

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's settings for this request, ``max_tokens`` resolved by the endpoint."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=max(self.top_k, 0),  # vLLM's -1 and OpenAI's absent both mean every token
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_GenerationRequest):
    #: one prompt: text (the artifact's tokenizer encodes it) or token ids
    prompt: str | list[StrictInt]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        if not (isinstance(prompt, str) or ids):
            raise ValueError("must be one prompt: a string or a list of token ids (send a batch as several requests)")
        if not prompt:
            raise ValueError("must not be empty")
        return prompt


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    #: OpenAI's newer name for max_tokens (either may be given; this one wins)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


def _now() -> int:
    return int(time.time())


class _Response(BaseModel):
    """What every completion, chat completion and chunk carries besides its ``object`` and ``choices``."""

    id: str
    created: int = Field(default_factory=_now)
    model: str
    usage: Usage | None = None


class _Choice(BaseModel):
    index: int = 0
    logprobs: None = None
    finish_reason: str | None = None


class CompletionChoice(_Choice):
    text: str
    token_ids: list[int] | None = None


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Choice):
    message: AssistantMessage


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Choice):
    delta: Delta


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "aotforge"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo
