"""Load the causal LM a text-generation build starts from: a transformers directory, a module, a file."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from aotforge.core.decoder import CARRIED_FILES
from aotforge.core.errors import ModelLoadError, UnsupportedModelError, describe


@dataclasses.dataclass
class CausalLM:
    """The source model in eval mode with eager attention (the exported graphs take a 4D mask)."""

    model: Any
    name: str
    format: str
    sha256: str
    #: Files to copy into the artifact, by their name there.
    files: dict[str, Path] = dataclasses.field(default_factory=dict)
    #: More about the source for the manifest's ``source`` record (a GGUF's architecture and quantization).
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: What holds a converted source's files (a GGUF's directory) on disk until the build has copied them.
    scratch: Any = None

    @property
    def tokenizer_dir(self) -> Path | None:
        """The directory the model's tokenizer loads from; None when it came without one."""
        found = [p for n, p in self.files.items() if n in ("tokenizer.json", "tokenizer_config.json")]
        return found[0].parent if found else None


def load_causal_lm(model: Any, name: str | None = None) -> CausalLM:
    """``model``: a transformers causal-LM directory, a GGUF file, a ``.py`` file whose ``get_model()`` returns
    one, or the ``PreTrainedModel`` itself."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_dir():
            return _from_dir(path, name)
        if path.suffix == ".py" and path.is_file():
            return _from_file(path, name)
        if path.suffix == ".gguf" and path.is_file():
            return _from_gguf(path, name)
        raise ModelLoadError(
            f"{model} is neither a transformers model directory (config.json + safetensors), a .gguf file nor a "
            ".py file with get_model(): give one of those for --task text-generation"
        )
    return _checked(model, name or type(model).__name__.lower(), "torch", _weights_sha(model), {})


def refuse_from_config(model: Any, name: str | None, target: str, max_seq_len: int) -> None:
    """A transformers directory whose ``config.json`` alone shows the graphs cannot compute its attention is refused
    before its weights load (a large model's take minutes); other sources are checked once loaded. A config
    transformers cannot read is left to the load, whose error says why."""
    path = Path(model) if isinstance(model, (str, Path)) else None
    if path is None or not (path / "config.json").is_file():
        return
    from transformers import AutoConfig

    from aotforge.compiler.generative.graphs import refuse_unsupported

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception:
        return
    refuse_unsupported(config, name or path.name, target, max_seq_len)


def _from_dir(path: Path, name: str | None) -> CausalLM:
    import torch
    from transformers import AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: save the model with save_pretrained(dir)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, attn_implementation="eager", dtype=torch.float32
        )
    except Exception as e:
        raise ModelLoadError(
            f"transformers cannot load {path} as a causal LM offline: {describe(e)}; "
            "it needs config.json and the weights (safetensors) of a *ForCausalLM architecture"
        ) from e
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.is_file() and (file.name == "config.json" or file.suffix == ".safetensors"):
            digest.update(file.name.encode() + file.read_bytes())
    files = {f: path / f for f in CARRIED_FILES if (path / f).is_file()}
    return _checked(model, name or path.name, "transformers", digest.hexdigest(), files)


def _from_gguf(path: Path, name: str | None) -> CausalLM:
    """The GGUF dequantized to fp32 into a directory of its own, loaded as a directory is; hashed as the file."""
    from aotforge.compiler.generative.gguf_source import converted_directory, gguf_details, gguf_sha256

    scratch = converted_directory(path)
    loaded = _from_dir(Path(scratch.name) / "model", name or path.name.split(".")[0])
    details = {"gguf": gguf_details(path)}
    return dataclasses.replace(loaded, format="gguf", sha256=gguf_sha256(path), details=details, scratch=scratch)


def _from_file(path: Path, name: str | None) -> CausalLM:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"aotforge_model_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ModelLoadError(f"importing {path} failed: {describe(e)}") from e
    if not callable(getattr(module, "get_model", None)):
        raise ModelLoadError(f"{path} defines no get_model(): it must return a transformers causal LM")
    model = module.get_model()
    return _checked(model, name or path.stem, "torch", _weights_sha(model), {})


def _checked(model: Any, name: str, fmt: str, sha: str, files: dict[str, Path]) -> CausalLM:
    if not (hasattr(model, "get_output_embeddings") and hasattr(model, "base_model") and hasattr(model, "config")):
        raise UnsupportedModelError(
            f"{name} is a {type(model).__name__}, not a transformers causal LM (*ForCausalLM / *LMHeadModel): "
            "--task text-generation needs one"
        )
    model = model.eval().float()
    model.set_attn_implementation("eager")
    return CausalLM(model, name, fmt, sha, files)


def _weights_sha(model: Any) -> str:
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode() + tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()
