"""``aotforge serve ARTIFACT --replicas 2`` on a real two-node Ray cluster on 127.0.0.1 (``tests/ray_cluster.py``),
run inside a private network namespace by ``tests/test_serve_replicas.py``:

    python tests/ray_serve_replicas.py WORK ARTIFACT PROMPTS_JSON

Starts the cluster, the server against it (its own process group), waits for /health, sends every prompt at once
through the openai client, reads Ray Serve's status, stops the server with SIGINT; prints one JSON line last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.ray_cluster import ROOT, _free_port, cluster, listeners  # noqa: E402

REPLICAS = 2


def _wait_healthy(url: str, server: subprocess.Popen[bytes], deadline_s: float = 420) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if server.poll() is not None:
            raise RuntimeError(f"aotforge serve exited with {server.returncode}: see serve.log")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"the replicas were not healthy within {deadline_s:.0f} s: see serve.log")


async def _ask_all(url: str, prompts: list[list[int]], new: int) -> list[list[int]]:
    import openai

    async def ask(prompt: list[int]) -> list[int]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300) as client:
            extra = {"ignore_eos": True, "return_token_ids": True}
            model = (await client.models.list()).data[0].id
            done = await client.completions.create(
                model=model, prompt=prompt, max_tokens=new, temperature=0, extra_body=extra
            )
            return list(done.choices[0].model_extra["token_ids"])

    return list(await asyncio.gather(*(ask(p) for p in prompts)))


#: A driver that prints Ray Serve's replica states by deployment (``{"aotforge": {"RUNNING": 2}}``), once
#: ``RUNNING`` of them run or at ``END`` (monotonic seconds): the controller may not answer yet, which reads as none.
_STATES = """
import json, sys, time, ray
from ray import serve

ray.init(address=sys.argv[1])
running, end = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])

def states():
    try:
        app = serve.status().applications.get("aotforge")
    except Exception:
        return {}
    deployments = app.deployments.items() if app else ()
    return {n: {str(k): v for k, v in d.replica_states.items()} for n, d in deployments}

while states().get("aotforge", {}).get("RUNNING", 0) < running and time.monotonic() < end:
    time.sleep(1)
print(json.dumps(states()))
"""


def _replica_states(address: str, running: int = 0, deadline_s: float = 300) -> dict:
    """The replica states; with ``running``, once that many replicas run or at ``deadline_s``: one interpreter
    polls, not a Ray driver started for each look."""
    command = [sys.executable, "-c", _STATES, address, str(running), str(deadline_s)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=deadline_s + 120)
    return json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {"error": run.stderr[-2000:]}


def _wait_running(address: str, deadline_s: float = 300) -> None:
    states = _replica_states(address, REPLICAS, deadline_s)
    if states.get("aotforge", {}).get("RUNNING", 0) < REPLICAS:
        raise RuntimeError(f"{REPLICAS} replicas were not running within {deadline_s:.0f} s ({states}): see serve.log")


def main(work: Path, artifact: Path, request: dict) -> dict:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with cluster(work) as address:
        command = [sys.executable, "-m", "aotforge", "serve", str(artifact), "--replicas", str(REPLICAS)]
        command += ["--ray-address", address, "--host", "127.0.0.1", "--port", str(port), "--drain-timeout", "5"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with (work / "serve.log").open("wb") as log:
            server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_healthy(url, server)
            _wait_running(address)  # the proxy answers as soon as one replica is up
            tokens = asyncio.run(_ask_all(url, request["prompts"], request["new"]))
            states = _replica_states(address)
            ports = listeners()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    log_tail = (work / "serve.log").read_text(errors="replace")[-3000:]
    return {"tokens": tokens, "states": states, "ports": ports, "rc": server.returncode, "log": log_tail}


if __name__ == "__main__":
    directory, artifact_dir = Path(sys.argv[1]), Path(sys.argv[2])
    print(json.dumps(main(directory, artifact_dir, json.loads(Path(sys.argv[3]).read_text()))))
