"""A GGUF file compiles like the transformers directory it came from: dequantized to fp32 by transformers' GGUF
reader, then the text-generation build as usual; the task needs no flag (a GGUF holds a causal LM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aotforge
from aotforge.compiler.generative.gguf_source import gguf_sha256
from aotforge.core.errors import ModelLoadError
from tests.gguf_models import write_llama_gguf
from tests.in_process import ISOLATE_BACKEND
from tests.llm_models import MAX_BATCH, MAX_SEQ, TVM_BUCKETS, assert_generates_like_transformers, tiny_causal_lm
from tests.test_errors import run_cli


@pytest.mark.parametrize("target", ["onnxruntime", pytest.param("tvm", marks=pytest.mark.slow)])
def test_fp32_gguf_builds_token_exact_against_the_model_it_was_written_from(target: str, tmp_path: Path) -> None:
    """The GGUF stores the Q / K rows in llama.cpp's rotary order: tokens equal to the original transformers
    model's prove the conversion undid it, and the manifest names the file as the source. (tvm builds what
    the converted directory gives it, the path tests/test_generative_tvm.py covers: behind slow.)"""
    model = tiny_causal_lm("llama")
    gguf = write_llama_gguf(model, tmp_path / "tiny-llama.gguf")
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
    whose weights are the fp16 values (not the original model's). A file cut short is one clear error."""
    import torch
    from transformers import AutoModelForCausalLM

    model = tiny_causal_lm("llama")
    gguf = write_llama_gguf(model, tmp_path / "half.gguf", dtype=np.float16)
    read = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32).eval()
    embed = read.get_input_embeddings().weight.detach().numpy()
    assert np.array_equal(embed, embed.astype(np.float16).astype(np.float32))
    assert not np.array_equal(embed, model.get_input_embeddings().weight.detach().numpy())
    common = ["--target", "onnxruntime", "--no-bench", "--max-seq-len", str(MAX_SEQ), "--max-batch", str(MAX_BATCH)]
    proc = run_cli("compile", str(gguf), "--out", str(tmp_path / "out"), *common)
    assert proc.returncode == 0, proc.stderr
    assert_generates_like_transformers(aotforge.load(proc.stdout.strip().splitlines()[-1]), read)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(gguf.read_bytes()[:4096])  # a download cut short
    proc = run_cli("compile", str(broken), "--out", str(tmp_path / "out2"), *common)
    assert proc.returncode == 2 and "broken.gguf is not a readable GGUF file" in proc.stderr, proc.stderr
    assert not (tmp_path / "out2").exists() or not any((tmp_path / "out2").rglob("manifest.json"))


def test_a_path_that_is_no_model_names_every_form_taken(tmp_path: Path) -> None:
    from aotforge.compiler.generative.source import load_causal_lm

    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match=r"\.gguf file"):
        load_causal_lm(tmp_path / "weights.bin")
