"""A GGUF file (llama.cpp's format) as the source of a text-generation build.

transformers reads GGUF (``from_pretrained(dir, gguf_file=...)``, through the ``gguf`` package): it dequantizes
every tensor to fp32 and rebuilds the config, tokenizer and generation config from the file's metadata. The
model it returns refuses ``save_pretrained`` ("quantized with gguf"), so its state dict goes into a plain model of
the same architecture, saved with the tokenizer as a transformers directory: from there the build is the one a
directory gets, chat template and end-of-sequence ids included.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from aotforge.core.errors import ModelLoadError, UnsupportedModelError, describe


def gguf_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_details(path: Path) -> dict[str, Any]:
    """What the manifest's source records of a GGUF: its architecture, file type and tensor types (counts)."""
    from collections import Counter

    import gguf

    reader = gguf.GGUFReader(path)
    file_type = reader.fields.get("general.file_type")
    return {
        "architecture": str(reader.fields["general.architecture"].contents()),
        "file_type": gguf.LlamaFileType(file_type.contents()).name if file_type is not None else None,
        "tensor_types": dict(sorted(Counter(t.tensor_type.name for t in reader.tensors).items())),
    }


def gguf_to_directory(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` into an fp32 transformers causal-LM directory ``out`` (weights, config, tokenizer)."""
    try:  # transformers' GGUF reader, and the loader it runs only with accelerate
        import accelerate  # noqa: F401
        import gguf as _gguf  # noqa: F401
    except ImportError as e:
        raise ModelLoadError(
            f"{gguf} is a GGUF file and reading one needs the gguf and accelerate packages: "
            "pip install 'aotforge[gguf]'"
        ) from e
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:
        if "architecture" in str(e) and "not supported" in str(e):  # transformers names the one it cannot read
            raise UnsupportedModelError(
                f"transformers cannot read {gguf.name}: {describe(e)}; convert the model to a transformers "
                "directory (save_pretrained) and compile that"
            ) from e
        raise ModelLoadError(
            f"{gguf} is not a readable GGUF file ({describe(e)}): a truncated or corrupt download? Fetch it again"
        ) from e
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.eval().save_pretrained(out)
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception:  # a GGUF without tokenizer metadata: the artifact serves token ids only, as a bare model does
        return
    tokenizer.save_pretrained(out)


def converted_directory(gguf: Path) -> tempfile.TemporaryDirectory[str]:
    """``gguf`` converted into a temporary directory (``<tmp>/model``), removed when the returned handle is."""
    scratch = tempfile.TemporaryDirectory(prefix="aotforge-gguf-")
    gguf_to_directory(gguf, Path(scratch.name) / "model")
    return scratch
