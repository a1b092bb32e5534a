"""A soak of an aotforge server: many requests, clients that go away mid-answer and bad requests mixed in.

Each request is one of: a good completion (streamed or not, ``ignore_eos``, so its usage must equal its
``max_tokens``), a client that disconnects (mid-stream after a few chunks, or while waiting for a whole answer),
or a bad request that must be answered with its status code and OpenAI's error body: malformed JSON (400), a
prompt past the context (400), an unknown model (404), a wrong API key (401, when the server asks for one).
Afterwards the server must hold nothing: no request running or waiting, no KV block held (``/metrics``). With the
server's process id, its resident memory (``VmRSS`` of ``/proc/PID/status``) is sampled as the soak goes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx

#: Bad requests by kind -> the status each must be answered with.
BAD = {"bad_json": 400, "too_long": 400, "unknown_model": 404, "wrong_key": 401}


@dataclasses.dataclass(frozen=True)
class SoakSpec:
    base_url: str
    num_requests: int = 1000
    #: requests in flight at once
    concurrency: int = 8
    #: fractions of the requests that are bad ones, and that disconnect; the rest are good
    bad_fraction: float = 0.2
    disconnect_fraction: float = 0.2
    #: prompts are random token ids below this (within any vocabulary the server's model has)
    token_range: int = 256
    max_prompt_tokens: int = 24
    max_tokens: int = 16
    api_key: str | None = None
    seed: int = 0
    #: the server's process id (its RSS sampled every ``rss_every`` requests), or None
    pid: int | None = None
    rss_every: int = 25
    #: how long the server may take to hold nothing once the last request is answered
    settle_s: float = 30.0


@dataclasses.dataclass
class Outcome:
    kind: str
    status: int | None = None
    problem: str | None = None


def rss_kib(pid: int) -> int:
    """The process's resident memory in KiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"/proc/{pid}/status has no VmRSS line")


def soak(spec: SoakSpec) -> dict[str, Any]:
    return asyncio.run(_soak(spec))


async def _soak(spec: SoakSpec) -> dict[str, Any]:
    rng = random.Random(spec.seed)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    limits = httpx.Limits(max_connections=spec.concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=spec.base_url, headers=headers, limits=limits, timeout=120.0) as client:
        models = (await client.get("/v1/models")).json()["data"][0]
        kinds = _kinds(rng, spec)
        gate = asyncio.Semaphore(spec.concurrency)
        rss: list[tuple[int, int]] = []
        done = 0

        async def one(kind: str, seed: int) -> Outcome:
            nonlocal done
            async with gate:
                outcome = await _request(client, spec, models, kind, random.Random(seed))
            done += 1
            if spec.pid is not None and (done % spec.rss_every == 0 or done == 1):
                rss.append((done, rss_kib(spec.pid)))
            return outcome

        started = time.perf_counter()
        outcomes = await asyncio.gather(*(one(k, rng.randrange(2**32)) for k in kinds))
        seconds = time.perf_counter() - started
        state = await _settled(client, spec.settle_s)
    if spec.pid is not None:
        rss.append((len(kinds), rss_kib(spec.pid)))
    return _report(outcomes, state, rss, seconds)


def _kinds(rng: random.Random, spec: SoakSpec) -> list[str]:
    """Each request's kind, drawn at the spec's fractions; the bad ones take each bad kind in turn (so a short
    soak sends every kind)."""
    bad = itertools.cycle(k for k in BAD if k != "wrong_key" or spec.api_key)
    kinds = []
    for _ in range(spec.num_requests):
        draw = rng.random()
        if draw < spec.bad_fraction:
            kinds.append(next(bad))
        elif draw < spec.bad_fraction + spec.disconnect_fraction:
            kinds.append(rng.choice(["disconnect_stream", "disconnect_wait"]))
        else:
            kinds.append(rng.choice(["good_stream", "good"]))
    return kinds


async def _request(
    client: httpx.AsyncClient, spec: SoakSpec, model: dict[str, Any], kind: str, rng: random.Random
) -> Outcome:
    n, max_tokens = rng.randint(1, spec.max_prompt_tokens), rng.randint(1, spec.max_tokens)
    body: dict[str, Any] = {
        "model": model["id"],
        "prompt": [rng.randrange(1, spec.token_range) for _ in range(n)],
        "max_tokens": max_tokens,
        "temperature": rng.choice([0.0, 0.8]),
        "ignore_eos": True,
        "stream": kind.endswith("stream"),
    }
    try:
        if kind in BAD:
            return await _bad(client, kind, body, model)
        if kind == "disconnect_stream":
            return await _disconnect_stream(client, body, rng)
        if kind == "disconnect_wait":
            return await _disconnect_wait(spec, body, rng)
        return await (_good_stream if body["stream"] else _good)(client, body, max_tokens)
    except (httpx.HTTPError, OSError, json.JSONDecodeError, KeyError) as e:
        return Outcome(kind, problem=f"{type(e).__name__}: {e}")


async def _bad(client: httpx.AsyncClient, kind: str, body: dict[str, Any], model: dict[str, Any]) -> Outcome:
    headers: dict[str, str] = {}
    if kind == "too_long":
        body["prompt"] = [1] * (int(model["max_model_len"]) + 1)
    elif kind == "unknown_model":
        body["model"] = model["id"] + "-nope"
    elif kind == "wrong_key":
        headers["Authorization"] = "Bearer not-the-key"
    content = b'{"model": "x", "prompt": [1, 2' if kind == "bad_json" else json.dumps(body).encode()
    headers["Content-Type"] = "application/json"
    response = await client.post("/v1/completions", content=content, headers=headers)
    error = response.json().get("error", {})
    problem = None
    if response.status_code != BAD[kind] or not error.get("message"):
        problem = f"answered {response.status_code} {response.text[:200]!r}, expected {BAD[kind]} with a message"
    return Outcome(kind, response.status_code, problem)


async def _good(client: httpx.AsyncClient, body: dict[str, Any], max_tokens: int) -> Outcome:
    response = await client.post("/v1/completions", json=body)
    if response.status_code != 200:
        return Outcome("good", response.status_code, f"answered {response.status_code}: {response.text[:200]}")
    got = response.json()
    return Outcome("good", 200, _check_usage(got["usage"], got["choices"][0]["finish_reason"], max_tokens))


async def _good_stream(client: httpx.AsyncClient, body: dict[str, Any], max_tokens: int) -> Outcome:
    body["stream_options"] = {"include_usage": True}
    usage, reason, ended = None, None, False
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            return Outcome("good_stream", response.status_code, f"answered {response.status_code}: {text[:200]}")
        async for line in response.aiter_lines():
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                ended = True
            elif data:
                event = json.loads(data)
                if "error" in event:
                    return Outcome("good_stream", 200, f"error event: {event['error']}")
                usage = event.get("usage") or usage
                reason = next((c["finish_reason"] for c in event["choices"] if c.get("finish_reason")), reason)
    problem = _check_usage(usage, reason, max_tokens) if ended else "the stream ended without [DONE]"
    return Outcome("good_stream", 200, problem)


def _check_usage(usage: dict[str, Any] | None, reason: str | None, max_tokens: int) -> str | None:
    if usage is None or usage.get("completion_tokens") != max_tokens or reason != "length":
        return f"usage {usage} and finish_reason {reason!r}, expected {max_tokens} tokens and 'length'"
    return None


async def _disconnect_stream(client: httpx.AsyncClient, body: dict[str, Any], rng: random.Random) -> Outcome:
    """Read a few chunks (maybe none), then close the connection."""
    keep = rng.randint(0, 3)
    async with client.stream("POST", "/v1/completions", json=body) as response:
        status = response.status_code
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                keep -= 1
                if keep < 0:
                    break
    return Outcome("disconnect_stream", status, None if status == 200 else f"answered {status}")


async def _disconnect_wait(spec: SoakSpec, body: dict[str, Any], rng: random.Random) -> Outcome:
    """Send a request for a whole answer on a socket of its own and close it after a few milliseconds (the server
    may have answered by then). A raw socket: cancelling an HTTP client's request is the client's business."""
    url = httpx.URL(spec.base_url)
    payload = json.dumps(body).encode()
    head = [
        "POST /v1/completions HTTP/1.1",
        f"Host: {url.host}:{url.port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *([f"Authorization: Bearer {spec.api_key}"] if spec.api_key else []),
    ]
    _, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    await writer.drain()
    await asyncio.sleep(rng.uniform(0.001, 0.05))
    writer.close()
    await writer.wait_closed()
    return Outcome("disconnect_wait")


async def _settled(client: httpx.AsyncClient, deadline_s: float) -> dict[str, float]:
    """The server's gauges once nothing is running or waiting and no KV block is held (or at the deadline)."""
    end = time.monotonic() + deadline_s
    while True:
        state = _gauges((await client.get("/metrics")).text)
        if not any(state.values()) or time.monotonic() > end:
            return state
        await asyncio.sleep(0.1)


def _gauges(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    names = {
        "aotforge:num_requests_running": "running",
        "aotforge:num_requests_waiting": "waiting",
        "aotforge:kv_cache_usage_perc": "kv_cache_usage",
        "aotforge:kv_cache_blocks_used": "kv_blocks_used",
    }
    found = {v: float("nan") for v in names.values()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found[names[sample.name]] = float(sample.value)
    return found


def _report(outcomes: list[Outcome], state: dict[str, float], rss: list[tuple[int, int]], s: float) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        counts = by_kind.setdefault(o.kind, {"sent": 0, "problems": 0})
        counts["sent"] += 1
        counts["problems"] += o.problem is not None
    return {
        "requests": len(outcomes),
        "seconds": round(s, 2),
        "by_kind": by_kind,
        "problems": [f"{o.kind}: {o.problem}" for o in outcomes if o.problem][:10],
        "num_problems": sum(o.problem is not None for o in outcomes),
        "after": state,
        "rss_kib": rss,
    }


def rss_growth_kib(report: dict[str, Any], warmup: float = 0.2) -> int:
    """How much the server's RSS grew after the first ``warmup`` fraction of the requests (its buffers and
    allocator pools reach their size while it meets each prompt length and batch width for the first time)."""
    samples = report["rss_kib"]
    after = [kib for done, kib in samples if done >= warmup * report["requests"]]
    return after[-1] - after[0] if len(after) >= 2 else 0
