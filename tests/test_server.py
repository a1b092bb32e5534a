"""``aotforge serve`` as a user meets it: a real uvicorn server over the real engine and a real artifact, driven with
the ``openai`` client (and raw HTTP where the client would hide a status, a header or an SSE line)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from click.testing import CliRunner

from aotforge.compiler.cli import main
from tests.conftest import ROOT
from tests.llm_models import MAX_SEQ
from tests.lm_bytes import encode
from tests.serving import (
    API_KEY,
    CHAT_TEMPLATE,
    DEADLINE_S,
    MAX_BATCH,
    Served,
    free_port,
    metric,
    serving,
    wait_for,
)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
NAME = "llama-chat"


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0)


def idle(served: Served) -> bool:
    stats = served.engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0


def test_models_list(chat_server: Served) -> None:
    models = client(chat_server).models.list().data
    assert [m.id for m in models] == [NAME] and models[0].model_extra["max_model_len"] == MAX_SEQ


def test_completion_text_and_usage(chat_server: Served) -> None:
    done = client(chat_server).completions.create(
        model=NAME, prompt="Hello", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert done.object == "text_completion" and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (5, 6, 11)


def test_chat_completion_applies_the_template(chat_server: Served) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    done = client(chat_server).chat.completions.create(
        model=NAME, messages=messages, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    prompt = "<system>Be brief.\n<user>Hi\n<assistant>"  # CHAT_TEMPLATE with add_generation_prompt
    assert CHAT_TEMPLATE.startswith("{% for m in messages %}<{{ m['role'] }}>")
    assert done.choices[0].message.role == "assistant" and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (len(encode(prompt)), 4)


def test_stream_ends_in_done_with_usage_and_equals_the_whole_answer(chat_server: Served) -> None:
    kw: dict[str, Any] = {"model": NAME, "prompt": "The cat", "max_tokens": 12, "temperature": 0}
    kw["extra_body"] = {"ignore_eos": True, "return_token_ids": True}
    whole = client(chat_server).completions.create(**kw)
    chunks = list(client(chat_server).completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    streamed_ids = [t for c in chunks[:-1] for t in c.choices[0].model_extra["token_ids"]]
    assert streamed_ids == whole.choices[0].model_extra["token_ids"]
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    body = {**{k: v for k, v in kw.items() if k != "extra_body"}, "stream": True}
    with httpx.stream("POST", chat_server.v1 + "/completions", json=body, headers=AUTH) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_stop_string_ends_the_answer_before_it(chat_server: Served) -> None:
    kw: dict[str, Any] = {"model": NAME, "prompt": [40, 41, 42], "max_tokens": 30, "temperature": 0}
    kw["extra_body"] = {"ignore_eos": True}
    text = client(chat_server).completions.create(**kw).choices[0].text
    stop = next(ch for ch in text[1:] if ch.isascii() and ch.isprintable())  # greedy: the same text again
    done = client(chat_server).completions.create(**kw, stop=[stop, "never-there"])
    assert done.choices[0].text == text[: text.index(stop)] and done.choices[0].finish_reason == "stop"


def test_chat_stream(chat_server: Served) -> None:
    stream = client(chat_server).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 5


def test_greedy_equals_generate_among_eight_concurrent_requests(chat_server: Served, chat_artifact: Path) -> None:
    """Each answer is the artifact's own greedy ``generate`` of its prompt, whatever else shares the batch."""
    import aotforge

    rng = np.random.default_rng(7)
    lengths = [3, 40, 9, 17, 1, 28, 12, 33]
    prompts = [[int(t) for t in rng.integers(0, 256, n)] for n in lengths]
    new = [min(20, MAX_SEQ - n + 1) for n in lengths]
    loaded = aotforge.load(chat_artifact)
    want = [
        loaded.generate(np.array([p]), n, ignore_eos=True)[0, len(p) :].tolist()
        for p, n in zip(prompts, new, strict=True)
    ]

    async def ask(prompt: list[int], max_tokens: int) -> list[int]:
        async with openai.AsyncOpenAI(base_url=chat_server.v1, api_key=API_KEY, max_retries=0) as c:
            extra = {"ignore_eos": True, "return_token_ids": True}
            done = await c.completions.create(
                model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=extra
            )
            return list(done.choices[0].model_extra["token_ids"])

    async def ask_all() -> list[list[int]]:
        return list(await asyncio.gather(*(ask(p, n) for p, n in zip(prompts, new, strict=True))))

    assert asyncio.run(ask_all()) == want


def test_greedy_through_the_server_on_each_cpu_target(cpu_target: str, request: pytest.FixtureRequest) -> None:
    """Both CPU targets serve: the session's tiny Llama (no tokenizer) of each target answers token ids equal to
    its own ``generate``, two requests at once."""
    import aotforge
    from aotforge.runtime.params import EngineConfig

    path = Path(request.getfixturevalue("llama_ort" if cpu_target == "onnxruntime" else "llama_tvm").path)
    prompts = ([5, 17, 42, 99, 3, 250, 7], [8, 1, 300])
    want = [aotforge.load(path).generate(np.array([p]), 12, ignore_eos=True)[0, len(p) :].tolist() for p in prompts]
    with serving(path, EngineConfig(max_num_seqs=2)) as served:

        async def ask(prompt: tuple[int, ...] | list[int]) -> list[int]:
            async with openai.AsyncOpenAI(base_url=served.v1, api_key="-", max_retries=0) as c:
                extra = {"ignore_eos": True, "return_token_ids": True}
                done = await c.completions.create(
                    model=served.engine.model_name, prompt=list(prompt), max_tokens=12, temperature=0, extra_body=extra
                )
                return list(done.choices[0].model_extra["token_ids"])

        async def both() -> list[list[int]]:
            return list(await asyncio.gather(*(ask(p) for p in prompts)))

        assert asyncio.run(both()) == want


ERRORS = [
    # (body or raw bytes, headers, status, type, param, message pattern)
    ({"model": NAME, "prompt": [1] * 60, "max_tokens": 10}, AUTH, 400, "invalid_request_error", None,
     ["10", "64"]),
    (b'{"model": "llama-chat", "prompt": ', AUTH | {"content-type": "application/json"}, 400, "invalid_request_error",
     None, ["not valid JSON"]),
    ({"model": NAME, "prompt": "Hi", "max_tokens": "many"}, AUTH, 400, "invalid_request_error", "max_tokens",
     ["max_tokens", "integer"]),
    ({"model": NAME, "prompt": "Hi", "temperature": "hot"}, AUTH, 400, "invalid_request_error", "temperature",
     ["temperature"]),
    ({"model": NAME, "prompt": ["a", "b"]}, AUTH, 400, "invalid_request_error", "prompt", ["prompt", "one prompt"]),
    ({"model": NAME, "prompt": "Hi", "n": 3}, AUTH, 400, "invalid_request_error", "n", ["n must be 1"]),
    ({"model": NAME, "prompt": "Hi", "logprobs": 2}, AUTH, 400, "invalid_request_error", None, ["logprobs"]),
    ({"model": "gpt-4o", "prompt": "Hi"}, AUTH, 404, "invalid_request_error", "model", ["gpt-4o", NAME]),
    ({"model": NAME, "prompt": "Hi"}, {}, 401, "authentication_error", None, ["missing API key"]),
    ({"model": NAME, "prompt": "Hi"}, {"Authorization": "Bearer nope"}, 401, "authentication_error", None,
     ["wrong API key"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "headers", "status", "kind", "param", "says"),
    ERRORS,
    ids=["past-context", "malformed-json", "wrong-type", "wrong-float", "batch-prompt", "n", "unsupported",
         "unknown-model", "no-key", "wrong-key"],
)  # fmt: skip
def test_errors_in_openai_shape(
    chat_server: Served, body: Any, headers: dict[str, str], status: int, kind: str, param: str | None, says: list[str]
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"} | headers
    r = httpx.post(chat_server.v1 + "/completions", content=content, headers=headers)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and (error["type"], error["param"]) == (kind, param)
    assert all(s in error["message"] for s in says), error["message"]


def test_the_openai_client_raises_the_statuses(chat_server: Served) -> None:
    c = client(chat_server)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.completions.create(model="other", prompt="Hi")
    with pytest.raises(openai.BadRequestError, match="64"):
        c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x" * 70}], max_tokens=5)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=chat_server.v1, api_key="wrong", max_retries=0).models.list()


def test_disconnect_mid_stream_aborts_and_frees_the_blocks(chat_server: Served) -> None:
    before = httpx.get(chat_server.url + "/metrics").text
    body = {"model": NAME, "prompt": [5] * 8, "max_tokens": 56, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", chat_server.v1 + "/completions", json=body, headers=AUTH) as r:
        first = next(line for line in r.iter_lines() if line)
        assert first.startswith("data: {")
    # the connection is closed here, before the 56 tokens
    wait_for(lambda: idle(chat_server), "the aborted request's blocks to be freed")
    after = httpx.get(chat_server.url + "/metrics").text
    aborted = [metric(t, "aotforge:request_success_total", finished_reason="abort") for t in (before, after)]
    assert aborted[1] == aborted[0] + 1
    assert chat_server.engine.stats().kv_cache_usage == 0
    assert client(chat_server).completions.create(model=NAME, prompt="ok", max_tokens=2).usage.completion_tokens > 0


COUNTED = {
    "prompt_tokens": ("aotforge:prompt_tokens_total", {}),
    "generation_tokens": ("aotforge:generation_tokens_total", {}),
    "length": ("aotforge:request_success_total", {"finished_reason": "length"}),
    "ttft": ("aotforge:time_to_first_token_seconds_count", {}),
    "e2e": ("aotforge:e2e_request_latency_seconds_count", {}),
    "queue": ("aotforge:request_queue_time_seconds_count", {}),
    "http_200": ("aotforge:http_requests_total", {"path": "/v1/completions", "status": "200"}),
    "http_404": ("aotforge:http_requests_total", {"path": "/v1/completions", "status": "404"}),
    "http_400": ("aotforge:http_requests_total", {"path": "/v1/completions", "status": "400"}),
}


def test_metrics_agree_with_what_the_client_sent(chat_server: Served) -> None:
    wait_for(lambda: idle(chat_server), "the engine to be idle")

    def read() -> dict[str, float]:
        text = httpx.get(chat_server.url + "/metrics").text
        return {key: metric(text, name, **labels) for key, (name, labels) in COUNTED.items()} | {"text": text}  # type: ignore[dict-item]

    before = read()
    rng = np.random.default_rng(3)
    sent = [(int(n), int(m)) for n, m in zip(rng.integers(2, 30, 6), rng.integers(1, 12, 6), strict=True)]
    for n, m in sent:  # distinct token ids in each prompt: no prefix-cache hits to argue about
        prompt = [int(t) for t in rng.permutation(256)[:n]]
        done = client(chat_server).completions.create(
            model=NAME, prompt=prompt, max_tokens=m, temperature=0, extra_body={"ignore_eos": True}
        )
        assert done.usage.completion_tokens == m
    with pytest.raises(openai.NotFoundError):
        client(chat_server).completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client(chat_server).completions.create(model=NAME, prompt="x", max_tokens=-1)
    # The listener runs after the step that answered the last request: wait for it, then compare them all.
    wait_for(lambda: read()["e2e"] - before["e2e"] >= len(sent), "the last step's statistics")
    after = read()
    want = {"prompt_tokens": sum(n for n, _ in sent), "generation_tokens": sum(m for _, m in sent)}
    want |= dict.fromkeys(("length", "ttft", "e2e", "queue", "http_200"), len(sent)) | {"http_404": 1, "http_400": 1}
    assert {k: after[k] - before[k] for k in want} == want, after["text"]
    # A turn of the engine that runs no step (an abort of a request that is not there) counts nothing again:
    # once the engine has taken it from its inbox, the listeners have not heard the last step a second time.
    heard: list[Any] = []
    chat_server.engine.add_listener(heard.append)
    chat_server.engine.abort("no-such-request")
    wait_for(lambda: not chat_server.engine._inbox, "the engine to take the abort")
    assert heard == []
    assert {k: v for k, v in read().items() if k in want} == {k: after[k] for k in want}
    text = str(after["text"])
    assert metric(text, "aotforge:kv_cache_usage_perc") == 0 and metric(text, "aotforge:num_requests_running") == 0
    for name in ("num_requests_waiting", "num_preemptions_total", "prefix_cache_hits_total",
                 "prefix_cache_queries_total", "inter_token_latency_seconds_count"):  # fmt: skip
        assert f"aotforge:{name}" in text


def test_soak_with_disconnects_and_bad_requests_leaks_no_block(chat_server: Served) -> None:
    """150 requests, 12 at a time: whole answers, streams read to the end, streams dropped after a few chunks,
    answers given up on, and bad requests. Each bad one gets its status; each good one ends as ``length`` or
    ``abort`` in the metrics; afterwards nothing runs, nothing waits and no KV block is held."""
    rng = np.random.default_rng(11)
    kinds = rng.choice(["whole", "stream", "drop", "give_up", "bad_model", "too_long"], 150)
    before = httpx.get(chat_server.url + "/metrics").text

    async def one(c: httpx.AsyncClient, kind: str, i: int) -> int | None:
        n = int(rng.integers(1, 30))
        body = {"model": NAME, "prompt": [int(t) for t in rng.integers(0, 256, n)], "max_tokens": 24,
                "ignore_eos": True, "stream": kind in ("stream", "drop")}  # fmt: skip
        if kind == "bad_model":
            body["model"] = "nope"
        if kind == "too_long":
            body["max_tokens"] = MAX_SEQ + 1
        if kind == "give_up":  # the client stops waiting for the whole answer (almost always before it is done)
            with contextlib.suppress(httpx.ReadTimeout):
                await c.post("/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.001))
            return None
        async with c.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if kind == "drop" and line.startswith("data: {"):
                    break  # the connection closes on leaving the block
        return r.status_code

    async def run() -> list[int | None]:
        gate = asyncio.Semaphore(12)
        async with httpx.AsyncClient(base_url=chat_server.url, headers=AUTH, timeout=DEADLINE_S) as c:

            async def gated(kind: str, i: int) -> int | None:
                async with gate:
                    return await one(c, kind, i)

            return list(await asyncio.gather(*(gated(str(k), i) for i, k in enumerate(kinds))))

    statuses = asyncio.run(run())
    want = {"whole": 200, "stream": 200, "drop": 200, "give_up": None, "bad_model": 404, "too_long": 400}
    assert statuses == [want[str(k)] for k in kinds]
    wait_for(lambda: idle(chat_server), "every request to end and free its blocks")
    good = sum(k in ("whole", "stream", "drop", "give_up") for k in kinds)
    wait_for(lambda: _ended(chat_server, before) == good, "the metrics of every request")
    stats = chat_server.engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage, stats.kv_blocks_used) == (0, 0, 0, 0)


def _ended(served: Served, before: str) -> float:
    after = httpx.get(served.url + "/metrics").text
    return sum(
        metric(after, "aotforge:request_success_total", finished_reason=reason)
        - metric(before, "aotforge:request_success_total", finished_reason=reason)
        for reason in ("length", "abort", "stop", "error")
    )


def test_serve_flags_are_engine_config_fields() -> None:
    from aotforge.compiler.cli.serve import serve
    from aotforge.runtime.params import EngineConfig

    params = {p.name: p for p in serve.params}
    assert {f.name: f.default for f in dataclasses.fields(EngineConfig)} == {
        f.name: params[f.name].default for f in dataclasses.fields(EngineConfig)
    }
    assert params["enable_prefix_caching"].secondary_opts == ["--no-prefix-caching"]
    refused = CliRunner().invoke(main, ["serve", "any-artifact", "--block-size", "0"])
    assert refused.exit_code == 2 and "block_size must be >= 1" in refused.output


def test_serve_refuses_more_sequences_than_the_artifact_batch(chat_artifact: Path) -> None:
    refused = CliRunner().invoke(main, ["serve", str(chat_artifact), "--max-num-seqs", str(MAX_BATCH + 1)])
    assert refused.exit_code == 2 and f"is more than the artifact's max_batch {MAX_BATCH}" in refused.output


def test_health(chat_server: Served) -> None:
    r = httpx.get(chat_server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_an_artifact_without_tokenizer_or_chat_template(llama_ort: Any) -> None:
    """The session's tiny Llama (``tests/conftest.py``) has no tokenizer files, so no chat template either."""
    from aotforge.runtime.params import EngineConfig

    with serving(Path(llama_ort.path), EngineConfig(max_num_seqs=2), served_model_name="plain") as served:
        c = openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            c.chat.completions.create(model="plain", messages=[{"role": "user", "content": "Hi"}])
        with pytest.raises(openai.BadRequestError, match="no tokenizer: send the prompt as a list of token ids"):
            c.completions.create(model="plain", prompt="Hi")
        done = c.completions.create(model="plain", prompt=[1, 2, 3], max_tokens=3, extra_body={"ignore_eos": True})
        assert done.usage.completion_tokens == 3 and [m.id for m in c.models.list().data] == ["plain"]


def test_a_full_queue_is_429_with_retry_after(chat_artifact: Path) -> None:
    from aotforge.runtime.params import EngineConfig

    with serving(chat_artifact, EngineConfig(max_num_seqs=1, max_waiting=0)) as served:  # every request waits first
        r = httpx.post(served.v1 + "/completions", json={"model": NAME, "prompt": "Hi"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error" and "--max-waiting 0" in r.json()["error"]["message"]
        with pytest.raises(openai.RateLimitError, match="retry later"):
            openai.OpenAI(base_url=served.v1, api_key="-", max_retries=0).completions.create(model=NAME, prompt="x")


class FailingRunner:
    """The artifact's real model runner, failing where a test asks: the prefill of a prompt that starts with
    :data:`POISON`, and the next ``fail_decodes`` decode steps."""

    POISON = [499, 498, 497]

    def __init__(self, runner: Any) -> None:
        self._runner, self.fail_decodes = runner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        if token_ids[:3].tolist() == self.POISON:
            raise RuntimeError("injected prefill fault")
        return self._runner.prefill(token_ids, block_table)

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        if self.fail_decodes:
            self.fail_decodes -= 1
            raise RuntimeError("injected decode fault")
        return self._runner.decode(token_ids, positions, block_tables)


def test_a_runner_fault_fails_its_request_with_500_and_the_server_keeps_serving(chat_artifact: Path) -> None:
    from aotforge.runtime.params import EngineConfig

    with serving(chat_artifact, EngineConfig(max_num_seqs=2)) as served:
        runner = served.engine.engine.runner = FailingRunner(served.engine.engine.runner)
        url = served.v1 + "/completions"
        for stream in (False, True):  # the fault on the first step: an HTTP 500 either way, before any event
            r = httpx.post(url, json={"model": NAME, "prompt": [*FailingRunner.POISON, 5], "stream": stream})
            assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
            assert "injected prefill fault" in r.json()["error"]["message"]
        runner.fail_decodes = 1  # a fault after the first token: the stream's error event, then [DONE]
        body = {"model": NAME, "prompt": [9, 8, 7], "max_tokens": 10, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url, json=body) as r:
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
        assert r.status_code == 200 and json.loads(events[0])["choices"][0]["text"] is not None
        assert "injected decode fault" in json.loads(events[-2])["error"]["message"] and events[-1] == "[DONE]"
        done = openai.OpenAI(base_url=served.v1, api_key="-", max_retries=0).completions.create(
            model=NAME, prompt=[9, 8, 7], max_tokens=10, extra_body={"ignore_eos": True}
        )
        assert done.usage.completion_tokens == 10
        wait_for(lambda: idle(served), "the engine to be idle")
        errors = metric(
            httpx.get(served.url + "/metrics").text, "aotforge:request_success_total", finished_reason="error"
        )
        assert errors == 3


def test_sigterm_drains_the_running_stream(chat_artifact: Path) -> None:
    """``aotforge serve`` in its own process: SIGTERM while a stream runs -> the stream still ends with its last
    token and ``[DONE]``, then the app shuts the engine down and the process ends."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "aotforge",
        "serve",
        str(chat_artifact),
        "--port",
        str(port),
        "--drain-timeout",
        "20",
        "--max-num-seqs",
        str(MAX_BATCH),
    ]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: _healthy(port) or proc.poll() is not None, "aotforge serve to start")
        assert proc.poll() is None, proc.communicate()[0]
        body = {"model": NAME, "prompt": [7] * 4, "max_tokens": 60, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=DEADLINE_S) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        # uvicorn re-raises the signal once it has shut down: the exit status says SIGTERM, as a server's should
        assert proc.wait(DEADLINE_S) == -signal.SIGTERM
        assert "Application shutdown complete" in proc.communicate()[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    except httpx.HTTPError:
        return False
