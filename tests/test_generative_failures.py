"""Failure paths of the text-generation commands: one clear error, a non-zero exit, and nothing written.

``perplexity`` and ``generate`` only read their artifacts; ``compile --speculative-k`` refusals come before any
output. Each test compares the artifact directories and ``--out`` (every file's sha256) before and after the
failed command. The artifacts are the session's (``tests/conftest.py``): nothing here builds a decoder. The
generative ``finish`` failures sit with their bundles in ``tests/test_tensorrt_generative.py`` and
``tests/test_neuron_generative.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from aotforge.compiler.cli import main
from aotforge.core.errors import EXIT_TARGET_UNAVAILABLE, EXIT_USER, EXIT_VALIDATION
from tests.conftest import assert_refused, quick_build, tree_state
from tests.llm_models import MAX_SEQ, SPECULATIVE_K
from tests.tiny_models import relu_add


@pytest.fixture(scope="module")
def plain_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-op ONNX model's artifact: not a text-generation artifact (a few seconds)."""
    root = tmp_path_factory.mktemp("plain")
    return Path(quick_build(str(relu_add(root / "m.onnx")), root / "out", target="onnxruntime").path)


def _invoke_unchanged(args: list[str], *paths: Path) -> Any:
    """Run the CLI; every path in ``paths`` must be the same (listing and bytes) afterwards."""
    before = [tree_state(p) for p in paths]
    result = CliRunner().invoke(main, args)
    assert [tree_state(p) for p in paths] == before, result.output
    return result


def test_perplexity_above_the_gate(llama_ort: Any, tmp_path: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(i % 400) for i in range(90)))
    args = ["perplexity", str(llama_ort.path), "--ids-file", str(ids), "--max-perplexity", "1.5"]
    result = _invoke_unchanged(args, llama_ort.path, tmp_path)
    assert_refused(result, EXIT_VALIDATION, r"perplexity [0-9.]+ is above --max-perplexity 1.5")
    assert result.stdout.startswith("perplexity ")  # the figure is printed before the gate fails


@pytest.mark.parametrize(
    ("option", "content", "match"),
    [
        ("--text-file", b"caf\xe9 au lait", r"is not UTF-8 text .*give --text-file a UTF-8 file"),
        ("--ids-file", b"1 2 \xff 3", r"is not UTF-8 text .*give --ids-file a UTF-8 file"),
        ("--ids-file", b"1 2 three", r"other than integer token ids"),
        ("--text-file", b"plain text", r"carries no tokenizer files"),
    ],
    ids=["text-not-utf8", "ids-not-utf8", "ids-not-integers", "text-without-tokenizer"],
)
def test_perplexity_refuses_a_bad_input_file(
    option: str, content: bytes, match: str, llama_ort: Any, tmp_path: Path
) -> None:
    given = tmp_path / "input.txt"
    given.write_bytes(content)
    result = _invoke_unchanged(["perplexity", str(llama_ort.path), option, str(given)], llama_ort.path, tmp_path)
    assert_refused(result, EXIT_USER, match)


def test_generate_refuses_a_mismatched_draft(llama_ort: Any, plain_artifact: Path) -> None:
    args = ["generate", str(llama_ort.path), "--prompt-ids", "1,2,3", "--draft", str(plain_artifact)]
    result = _invoke_unchanged(args, llama_ort.path, plain_artifact)
    assert_refused(result, EXIT_USER, r"draft .* is not a text-generation artifact: build the draft with --task")
    assert result.stdout == ""  # refused before the first token


def test_speculative_refusals_at_generate(llama_ort: Any, llama_draft: Path) -> None:
    base = ["generate", "--prompt-ids", "1,2,3", "--max-new-tokens", "4"]
    artifacts = (llama_draft, llama_ort.path)
    no_verify = _invoke_unchanged([*base, str(llama_draft), "--draft", str(llama_ort.path)], *artifacts)
    assert_refused(no_verify, EXIT_USER, r"no verify graph.*--speculative-k")
    too_many = [*base, str(llama_ort.path), "--draft", str(llama_draft), "--num-speculative-tokens"]
    wide = _invoke_unchanged([*too_many, str(SPECULATIVE_K + 1)], *artifacts)
    assert_refused(wide, EXIT_USER, rf"num_speculative_tokens must be in 1..{SPECULATIVE_K}")
    assert no_verify.stdout == wide.stdout == ""


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["-t", "onnxruntime", "--speculative-k", str(MAX_SEQ - 1)], rf"speculative_k must be in 0..{MAX_SEQ - 2}"),
        (["-t", "tensorrt", "--prepare-only", "--speculative-k", "2"], "no verify graph"),
        (["-t", "neuron", "--speculative-k", "2"], "no verify graph"),
    ],
    ids=["k-too-large", "tensorrt-bundle", "neuron"],
)
def test_speculative_k_refusals_at_compile(args: list[str], match: str, llama_dir: Path, tmp_path: Path) -> None:
    """Refused before the export: --out keeps what it held."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("an earlier build's")
    base = ["compile", str(llama_dir), "--task", "text-generation", "--max-seq-len", str(MAX_SEQ), "--out", str(out)]
    assert_refused(_invoke_unchanged([*base, *args], out, llama_dir), EXIT_USER, match)


def test_speculative_k_is_refused_for_a_model_that_is_not_a_decoder(tmp_path: Path) -> None:
    """Before: an ONNX classifier compiled with --speculative-k built, the option silently dropped."""
    model = relu_add(tmp_path / "m.onnx")
    out = tmp_path / "out"
    args = ["compile", str(model), "-t", "onnxruntime", "--speculative-k", "2", "--out", str(out), "--no-bench"]
    result = _invoke_unchanged(args, out)
    assert_refused(result, EXIT_USER, r"--speculative-k 2 compiles a verify graph for text-generation builds only")


def test_a_text_generation_build_for_an_absent_device_leaves_out_as_it_was(llama_dir: Path, tmp_path: Path) -> None:
    from aotforge.targets import get_target

    if get_target("neuron").probe().available:
        pytest.skip("neuron is available here")
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("an earlier build's")
    args = ["compile", str(llama_dir), "--task", "text-generation", "-t", "neuron", "--out", str(out)]
    assert_refused(_invoke_unchanged(args, out, llama_dir), EXIT_TARGET_UNAVAILABLE, "not available on this host")
