"""A GGUF file compiles like the transformers directory it came from: dequantized to fp32 by transformers' GGUF
reader, then the text-generation build as usual; the task needs no flag (a GGUF holds a causal LM).

Each family of the supported-decoders table that transformers reads from GGUF (``GGUF_ARCHITECTURES``): its
file loads as the model it was written from (default run, no export), and builds token-exact on both CPU targets
(slow); a GGUF architecture transformers cannot read is refused naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.compiler.generative.gguf_source import gguf_sha256
from aotforge.compiler.generative.source import load_causal_lm
from aotforge.core.errors import ModelLoadError, UnsupportedModelError
from tests.gguf_models import GGUF_ARCHITECTURES, write_gguf
from tests.in_process import ISOLATE_BACKEND
from tests.llm_models import (
    MAX_BATCH,
    MAX_SEQ,
    PROMPTS,
    TVM_BUCKETS,
    assert_generates_like_transformers,
    build_text_generation,
    tiny_causal_lm,
)
from tests.test_decoder_families import CONFIGS, decoder_of
from tests.test_errors import invoke_cli

_HEADS_4_2 = {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}
#: A configuration of each family transformers reads from GGUF, within what its file can carry (gguf_models.py).
GGUF_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3}),
    "mistral": CONFIGS["mistral-96x4-kv2"],
    "qwen2": CONFIGS["qwen2-96x4-kv2-bias"],
    "qwen3": ("qwen3", _HEADS_4_2),
    "phi3": CONFIGS["phi3-96x4-kv2"],
    "gemma2": ("gemma2", {**_HEADS_4_2, "head_dim": 32, "sliding_window": 8, "tie_word_embeddings": True}),
    # Gemma 3's layer types are not in the file: llama.cpp and transformers both take every sixth layer global
    "gemma3_text": ("gemma3_text", {**_HEADS_4_2, "head_dim": 32, "sliding_window": 8}),
    "falcon": CONFIGS["falcon-96x4-mq-parallel"],
    "stablelm": CONFIGS["stablelm-96x4-qkv-bias"],
    "gpt2": ("gpt2", {"n_embd": 120, "n_head": 5, "n_positions": 1024}),
}


#: Slow: by default, each family's file loads as the model it was written from (logits, through the build's own
#: ``load_causal_lm``: the rotary order undone) and the fp16 CLI build below generates as the model its file holds,
#: its manifest naming the file as the source; together they are this build's property, one export fewer.
@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnxruntime", "tvm"])
def test_fp32_gguf_builds_token_exact_against_the_model_it_was_written_from(target: str, tmp_path: Path) -> None:
    """The GGUF stores the Q / K rows in llama.cpp's rotary order: tokens equal to the original transformers
    model's prove the conversion undid it, and the manifest names the file as the source. (tvm builds what
    the converted directory gives it, the path tests/test_generative_tvm.py covers.)"""
    model = tiny_causal_lm("llama")
    gguf = write_gguf(model, tmp_path / "tiny-llama.gguf")
    options = {"target_options": TVM_BUCKETS} if target == "tvm" else {}
    result = aotforge.build(
        str(gguf),
        target=target,
        out=tmp_path / "out",
        bench=False,
        max_seq_len=MAX_SEQ,
        max_batch=MAX_BATCH,
        isolate_backend=ISOLATE_BACKEND,
        **options,
    )
    source = result.manifest.source
    assert (source["format"], source["sha256"]) == ("gguf", gguf_sha256(gguf))
    assert source["gguf"] == {"architecture": "llama", "file_type": None, "tensor_types": {"F32": 21}}
    assert result.manifest.name == "tiny-llama"
    assert_generates_like_transformers(aotforge.load(result.path), model)


def test_cli_compiles_an_fp16_gguf_without_task_and_refuses_a_broken_one(tmp_path: Path) -> None:
    """fp16 tensors are widened to fp32 exactly: the artifact generates as transformers does on the same file,
    whose weights are the fp16 values (not the original model's), and its manifest names the file as the source.
    A file cut short is one clear error."""
    import torch
    from transformers import AutoModelForCausalLM

    model = tiny_causal_lm("llama")
    gguf = write_gguf(model, tmp_path / "half.gguf", dtype=np.float16)
    read = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32).eval()
    embed = read.get_input_embeddings().weight.detach().numpy()
    assert np.array_equal(embed, embed.astype(np.float16).astype(np.float32))
    assert not np.array_equal(embed, model.get_input_embeddings().weight.detach().numpy())
    common = ["--target", "onnxruntime", "--no-bench", "--max-seq-len", str(MAX_SEQ), "--max-batch", str(MAX_BATCH)]
    proc = invoke_cli("compile", str(gguf), "--out", str(tmp_path / "out"), *common)
    assert proc.returncode == 0, proc.stderr
    artifact = aotforge.load(proc.stdout.strip().splitlines()[-1])
    assert_generates_like_transformers(artifact, read)
    source = artifact.manifest.source
    assert (source["format"], source["sha256"], artifact.manifest.name) == ("gguf", gguf_sha256(gguf), "half")
    # the 16 matrices (7 a layer, the embedding, the untied head) in fp16, the 5 norm vectors kept fp32
    assert source["gguf"] == {"architecture": "llama", "file_type": None, "tensor_types": {"F16": 16, "F32": 5}}
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(gguf.read_bytes()[:4096])  # a download cut short
    proc = invoke_cli("compile", str(broken), "--out", str(tmp_path / "out2"), *common)
    assert proc.returncode == 2 and "broken.gguf is not a readable GGUF file" in proc.stderr, proc.stderr
    assert not (tmp_path / "out2").exists() or not any((tmp_path / "out2").rglob("manifest.json"))


def test_a_path_that_is_no_model_names_every_form_taken(tmp_path: Path) -> None:
    from aotforge.compiler.generative.source import load_causal_lm

    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match=r"\.gguf file"):
        load_causal_lm(tmp_path / "weights.bin")


def _gguf_model(family: str) -> Any:
    """``GGUF_CONFIGS[family]``'s model; Gemma 2's tied head (its file has no other) would repeat the input token
    off the scaled embedding that dominates the residual, so its shared embedding is shrunk for varied tokens."""
    import torch

    model = decoder_of(*GGUF_CONFIGS[family])
    if family == "gemma2":
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(0.01)
    return model


@pytest.mark.parametrize("family", GGUF_ARCHITECTURES)
def test_gguf_of_each_family_loads_as_the_model_it_was_written_from(family: str, tmp_path: Path) -> None:
    """The build's GGUF source (read by transformers, rebuilt as a plain model of the family) computes the
    logits of the model the file was written from; the manifest's record names the file's architecture."""
    import torch

    model = _gguf_model(family)
    source = load_causal_lm(write_gguf(model, tmp_path / "tiny.gguf"))
    assert source.model.config.model_type == ("llama" if family == "mistral" else family)
    assert source.details["gguf"]["architecture"] == GGUF_ARCHITECTURES[family]
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        want, got = model(ids).logits, source.model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnxruntime", "tvm"])
@pytest.mark.parametrize("family", GGUF_ARCHITECTURES)
def test_gguf_of_each_family_builds_token_exact(family: str, target: str, tmp_path: Path) -> None:
    """The whole GGUF path per family and target: the artifact generates as transformers does on the file."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = write_gguf(_gguf_model(family), tmp_path / "tiny.gguf")
    read = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32).eval()
    options = {"target_options": TVM_BUCKETS} if target == "tvm" else {}
    result = build_text_generation(str(gguf), tmp_path / "out", target=target, **options)
    assert result.manifest.validation["token_agreement"] == 1.0
    assert_generates_like_transformers(aotforge.load(result.path), read)


def test_a_gguf_architecture_transformers_cannot_read_is_refused_naming_it(tmp_path: Path) -> None:
    """Gemma (1), GPT-NeoX, OPT ... have no GGUF reader in transformers: one error naming the architecture and
    the way round it, before any export."""
    import gguf

    path = tmp_path / "neox.gguf"
    writer = gguf.GGUFWriter(str(path), "gptneox")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match=r"transformers cannot read neox\.gguf: .*gptneox.*save_pretrained"):
        load_causal_lm(path)
