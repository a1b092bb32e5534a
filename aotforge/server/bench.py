"""``aotforge bench serve``: load any OpenAI-compatible server and measure it as ``vllm bench serve`` does.

Prompts are real English (the docstrings of Python's standard library), cut to a length in tokens (with the
server's tokenizer) or words; requests arrive as a Poisson process at ``request_rate`` (or all at once), at most
``max_concurrency`` in flight, each streaming ``/v1/completions`` (or chat). Per request: time to first token
(TTFT), the gaps between streamed chunks (ITL), time per output token after the first (TPOT) and end to end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import math
import random
import time
from typing import Any

import httpx
import numpy as np

from aotforge.core.errors import InputSpecError

#: Standard-library modules whose docstrings make the prompts (a fixed list: the text is the same everywhere).
CORPUS_MODULES = (
    "argparse", "asyncio", "bisect", "calendar", "collections", "contextlib", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "email.message", "enum", "fractions", "functools", "heapq", "http.client", "inspect",
    "io", "itertools", "json", "logging", "os", "pathlib", "pickle", "queue", "random", "re", "shutil", "socket",
    "sqlite3", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "typing",
    "unittest", "urllib.parse", "uuid", "zipfile",
)  # fmt: skip
#: The service levels ``--goodput`` may set, in milliseconds.
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """What to send, how fast, to which server."""

    base_url: str
    model: str | None = None  # None: the first model of GET /v1/models
    endpoint: str = "/v1/completions"
    num_prompts: int = 100
    request_rate: float = math.inf  # requests per second, Poisson arrivals; inf sends them all at once
    max_concurrency: int | None = None
    input_len: int = 128
    output_len: int = 64
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    ignore_eos: bool = False
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.endpoint not in ("/v1/completions", "/v1/chat/completions"):
            raise InputSpecError(f"endpoint {self.endpoint!r}: use /v1/completions or /v1/chat/completions")
        if not 0 <= self.range_ratio < 1:
            raise InputSpecError(f"range_ratio must be in [0, 1), got {self.range_ratio}")
        if min(self.num_prompts, self.input_len, self.output_len) < 1 or self.request_rate <= 0:
            raise InputSpecError("num_prompts, input_len, output_len and request_rate must be > 0")


@dataclasses.dataclass(frozen=True)
class Prompt:
    text: str
    prompt_len: int  # tokens (or words, without a tokenizer); the server's usage count replaces it
    output_len: int


@dataclasses.dataclass
class RequestResult:
    prompt_len: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    itls_s: list[float] = dataclasses.field(default_factory=list)
    e2e_s: float = 0.0
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def corpus() -> str:
    """The docstrings of :data:`CORPUS_MODULES` and their public members, one paragraph each, in a fixed order."""
    seen: dict[str, None] = {}
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        members = [module] + [v for k, v in sorted(vars(module).items()) if not k.startswith("_")]
        for obj in members:
            doc = inspect.getdoc(obj) if inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj) else None
            if doc and len(doc) > 80:
                seen.setdefault(" ".join(doc.split()), None)
    return "\n".join(seen)


def make_prompts(spec: LoadSpec, tokenizer: Any = None) -> list[Prompt]:
    """``num_prompts`` windows of the corpus at seeded offsets, their lengths drawn around ``input_len``."""
    rng = random.Random(spec.seed)
    units: list[Any] = tokenizer(corpus(), add_special_tokens=False)["input_ids"] if tokenizer else corpus().split()
    prompts = []
    for _ in range(spec.num_prompts):
        n_in, n_out = _length(rng, spec.input_len, spec.range_ratio), _length(rng, spec.output_len, spec.range_ratio)
        start = rng.randrange(0, len(units) - n_in)
        window = units[start : start + n_in]
        text = tokenizer.decode(window) if tokenizer else " ".join(window)
        prompts.append(Prompt(text, n_in, n_out))
    return prompts


def _length(rng: random.Random, length: int, ratio: float) -> int:
    return rng.randint(max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio))))


async def send(client: httpx.AsyncClient, spec: LoadSpec, model: str, prompt: Prompt) -> RequestResult:
    """One streamed request, timed from just before it is sent to its ``[DONE]``."""
    body: dict[str, Any] = {"model": model, "max_tokens": prompt.output_len, "temperature": 0.0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    if spec.ignore_eos:
        body["ignore_eos"] = True
    chat = spec.endpoint == "/v1/chat/completions"
    body.update({"messages": [{"role": "user", "content": prompt.text}]} if chat else {"prompt": prompt.text})
    result, chunks, usage = RequestResult(prompt.prompt_len), 0, None
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", spec.endpoint, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:300]}"
                return result
            async for line in response.aiter_lines():
                data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                if not data or data == "[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"].get("message", event["error"]))
                    return result
                usage = event.get("usage") or usage
                if event.get("choices"):  # a token event, as vLLM's bench counts them (its text may be empty)
                    now = time.perf_counter()
                    if chunks == 0:
                        result.ttft_s = now - start
                    else:
                        result.itls_s.append(now - last)
                    last, chunks = now, chunks + 1
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e_s = time.perf_counter() - start
    result.output_tokens = int(usage["completion_tokens"]) if usage else chunks
    result.prompt_len = int(usage["prompt_tokens"]) if usage else prompt.prompt_len
    if chunks == 0:
        result.error = "the stream ended without any token"
    return result


async def run_load(spec: LoadSpec, prompts: list[Prompt]) -> tuple[list[RequestResult], float]:
    """Send every prompt (arrivals and concurrency as the spec says); the results and the wall time taken."""
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    # A connection per request, as vLLM's bench opens a session per request: a server that closes an idle
    # keep-alive connection (llama-server does) would otherwise fail the next request sent on it.
    limits = httpx.Limits(max_connections=spec.max_concurrency or len(prompts), max_keepalive_connections=0)
    timeout = httpx.Timeout(spec.timeout_s)
    async with httpx.AsyncClient(base_url=spec.base_url, headers=headers, limits=limits, timeout=timeout) as client:
        model = spec.model or await served_model(client)
        gate = asyncio.Semaphore(spec.max_concurrency or len(prompts))
        rng = random.Random(spec.seed + 1)

        async def one(prompt: Prompt) -> RequestResult:
            async with gate:
                return await send(client, spec, model, prompt)

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(one(prompt)))
            if not math.isinf(spec.request_rate):
                await asyncio.sleep(rng.expovariate(spec.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


async def served_model(client: httpx.AsyncClient) -> str:
    response = await client.get("/v1/models")
    if response.status_code != 200:
        raise InputSpecError(f"GET /v1/models answered {response.status_code}: pass --model (or --api-key)")
    return str(response.json()["data"][0]["id"])


def summarize(
    results: list[RequestResult], duration_s: float, goodput: dict[str, float] | None = None
) -> dict[str, Any]:
    """vLLM's figures: counts, throughputs, and mean / median / std / p99 of TTFT, TPOT, ITL and E2E in ms."""
    ok = [r for r in results if r.error is None]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    report: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration": duration_s,  # seconds, under vLLM's key
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
    }
    samples = {
        "ttft_ms": [r.ttft_s * 1e3 for r in ok],
        "tpot_ms": [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None],
        "itl_ms": [s * 1e3 for r in ok for s in r.itls_s],
        "e2el_ms": [r.e2e_s * 1e3 for r in ok],
    }
    for name, values in samples.items():
        report |= {f"{stat}_{name}": value for stat, value in _stats(values).items()}
    if goodput:
        good = [r for r in ok if all(_meets(r, key, limit) for key, limit in goodput.items())]
        report["request_goodput"] = len(good) / duration_s
    return report


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(("mean", "median", "std", "p99"))
    a = np.asarray(values, dtype=float)
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "std": float(a.std()),
        "p99": float(np.percentile(a, 99)),
    }


def _meets(r: RequestResult, key: str, limit_ms: float) -> bool:
    value = {"ttft_ms": r.ttft_s, "tpot_ms": r.tpot_s or 0.0, "e2el_ms": r.e2e_s}[key]
    return value * 1e3 <= limit_ms


def parse_goodput(items: list[str]) -> dict[str, float]:
    """``ttft_ms=500,tpot_ms=50`` (comma- or space-separated, one option or several) -> the SLOs in ms."""
    slos = {}
    for item in (part for text in items for part in text.replace(",", " ").split()):
        key, sep, value = item.partition("=")
        if not sep or key not in SLO_KEYS:
            raise InputSpecError(f"--goodput {item!r}: use KEY=MS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise InputSpecError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
    return slos


def bench_serve(
    spec: LoadSpec, rates: list[float], *, goodput: dict[str, float] | None = None, tokenizer: Any = None
) -> dict[str, Any]:
    """One run per request rate over the same prompts: ``{"config": ..., "runs": [summary per rate]}``."""
    prompts = make_prompts(spec, tokenizer)
    runs = []
    for rate in rates:
        rated = dataclasses.replace(spec, request_rate=rate)
        results, duration = asyncio.run(run_load(rated, prompts))
        run = {"request_rate": _rate(rate), "max_concurrency": spec.max_concurrency}
        runs.append(run | summarize(results, duration, goodput))
    config = {k: v for k, v in dataclasses.asdict(spec).items() if k not in ("api_key", "request_rate")}
    return {"config": config | {"request_rates": [_rate(r) for r in rates], "goodput": goodput or {}}, "runs": runs}


def _rate(rate: float) -> float | str:
    """JSON has no infinity: "inf", as vLLM writes it."""
    return "inf" if math.isinf(rate) else rate
