"""What the server tests share: the tiny Llama with a tokenizer and a chat template, built for onnxruntime, and a
real uvicorn server on 127.0.0.1 (a free port) in a thread of the test process, over the real engine."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.llm_models import build_text_generation, save_tiny_causal_lm
from tests.lm_bytes import byte_tokenizer

#: A chat template as a model directory carries it (in tokenizer_config.json), over the byte tokenizer.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
API_KEY = "sk-test-aotforge"
#: How long a test waits for the server to reach a state (started, drained); never a figure that is asserted.
DEADLINE_S = 60.0


def chat_llama_dir(directory: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """The tiny random Llama (vocabulary 500) with the byte tokenizer (ids 0-263) and, if given, a chat template."""
    save_tiny_causal_lm("llama", directory)
    byte_tokenizer().save_pretrained(directory)
    if chat_template is not None:
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config_file.write_text(json.dumps({**config, "chat_template": chat_template}))
    return directory


#: The chat artifact's batch: the engine runs at most this many sequences at once (``--max-num-seqs``).
MAX_BATCH = 4


def build_chat_llama(root: Path, **kw: Any) -> Path:
    """The chat Llama's onnxruntime artifact (``max_seq_len`` 64, batch :data:`MAX_BATCH`)."""
    kw = {"max_batch": MAX_BATCH, **kw}
    return Path(build_text_generation(chat_llama_dir(root / "llama-chat"), root / "out", **kw).path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Served:
    """A running server: its URL (``.../v1`` for the openai client), the engine behind it and the app."""

    url: str
    engine: Any
    app: Any

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextmanager
def serving(artifact: Path, config: Any = None, **app_kw: Any) -> Iterator[Served]:
    """``load_async_engine`` + ``build_app`` on uvicorn in a thread; stopped (and the engine shut down by
    the app's lifespan) on exit."""
    import uvicorn

    from aotforge.artifacts.engine_loader import load_async_engine
    from aotforge.runtime.params import EngineConfig
    from aotforge.server.app import build_app

    engine = load_async_engine(artifact, config or EngineConfig())
    app = build_app(engine, **app_kw)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), "the server to start")
    assert server.started, "uvicorn did not start (see the log above)"
    try:
        yield Served(f"http://127.0.0.1:{port}", engine, app)
    finally:
        server.should_exit = True
        thread.join(DEADLINE_S)


def wait_for(condition: Any, what: str, deadline_s: float = DEADLINE_S) -> None:
    """Poll ``condition`` until it holds (a deadline against hanging, not a timing assert)."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline_s:.0f} s for {what}")
        time.sleep(0.02)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0.0 when the series is absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
