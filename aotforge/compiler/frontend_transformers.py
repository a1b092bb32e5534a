"""The transformers frontend: a ``save_pretrained`` directory + a task -> the torch frontend -> IR.

Loads with the Auto class of the task and ``local_files_only=True`` (never a hub download),
generates example inputs from the config (ids within the vocabulary, ``token_type_ids`` only
where the model has them, images at the preprocessor's or the config's size), makes the batch
and sequence dims dynamic by default, and hands the tokenizer / preprocessor files on to be
copied into the artifact under ``preprocessing/``.

This module imports only the standard library at import time: ``BuildOptions`` needs ``Task``
and a direct cache hit must not import torch.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.core import decoder
from aotforge.core.errors import ModelLoadError, OptionsError
from aotforge.core.spec import DimRange

if TYPE_CHECKING:
    from aotforge.compiler.source import SourceModel


class Task(enum.StrEnum):
    """What the compiled graph computes, as Optimum's and the pipelines' task names say.

    A ``StrEnum``: ``Task.TEXT_GENERATION == "text-generation"``, and JSON writes the name.
    """

    FEATURE_EXTRACTION = "feature-extraction"
    FILL_MASK = "fill-mask"
    TEXT_CLASSIFICATION = "text-classification"
    IMAGE_CLASSIFICATION = "image-classification"
    #: Prefill + decode graphs with a KV cache: ``compiler.generative``, not this module.
    TEXT_GENERATION = decoder.TEXT_GENERATION


_AUTO_CLASS = {
    Task.FEATURE_EXTRACTION: "AutoModel",
    Task.FILL_MASK: "AutoModelForMaskedLM",
    Task.TEXT_CLASSIFICATION: "AutoModelForSequenceClassification",
    Task.IMAGE_CLASSIFICATION: "AutoModelForImageClassification",
}
#: ``config.architectures`` suffix -> the task it was saved for (used when no task is given).
_ARCHITECTURE_TASK = {
    "ForMaskedLM": Task.FILL_MASK,
    "ForSequenceClassification": Task.TEXT_CLASSIFICATION,
    "ForImageClassification": Task.IMAGE_CLASSIFICATION,
    "Model": Task.FEATURE_EXTRACTION,
}
#: Files a serving host needs beside the graph to turn text or images into its inputs (and
#: logits into labels: config.json's id2label). Copied into the artifact when present.
PREPROCESSING_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "preprocessor_config.json",
    "processor_config.json",
)
PREPROCESSING_DIR = "preprocessing"
#: Default dynamic ranges (``--dynamic`` overrides each by name): batch 1..32 at 1, sequence
#: 1..the model's position limit at 128 (or at that limit when smaller).
DEFAULT_BATCH = DimRange("batch", 1, 1, 32)
DEFAULT_SEQ_OPT = 128
#: Models without a position limit (relative attention: T5) get this sequence maximum.
DEFAULT_SEQ_MAX = 512


def parse_task(value: Task | str) -> Task:
    try:
        return value if isinstance(value, Task) else Task(str(value))
    except ValueError:
        raise OptionsError(f"unknown task {value!r}: give one of {', '.join(t.value for t in Task)}") from None


def load_transformers_dir(
    path: Path,
    task: Task | None,
    dims: tuple[DimRange, ...],
    ranges: Mapping[str, tuple[float, float]],
) -> SourceModel:
    """Load ``path`` (a transformers ``save_pretrained`` directory) for ``task`` and export it."""
    import dataclasses

    from aotforge.compiler.frontend_torch import load_torch_module

    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{path} is a directory without config.json: give a transformers save_pretrained directory, "
            "a .onnx file or a .py model file"
        )
    config = _config(path)
    task = task or _task_from_config(path, config)
    model = _model(path, task, config)
    inputs, axes, found_ranges = _example_inputs(model, config, path, dims)
    declared = _default_dims(config, axes, dims)
    name = path.resolve().name
    source = load_torch_module(
        model,
        inputs,
        name=name,
        dims=declared,
        dynamic_axes=axes,
        ranges={**found_ranges, **ranges},
    )
    files = {f"{PREPROCESSING_DIR}/{f}": path / f for f in PREPROCESSING_FILES if (path / f).is_file()}
    # The source stays a torch program (its reference is torch eager); the manifest says which directory made it.
    details = {
        "frontend": "transformers",
        "task": task.value,
        "architecture": type(model).__name__,
        "preprocessing": sorted(files),
    }
    return dataclasses.replace(
        source,
        io=dataclasses.replace(source.io, dims=declared),
        sha256=_dir_sha256(path, task),
        files=files,
        details=details,
    )


def _config(path: Path) -> Any:
    from transformers import AutoConfig

    try:
        # Eager attention: the exporter's SDPA decomposition is the same math in more ops.
        return AutoConfig.from_pretrained(path, local_files_only=True, attn_implementation="eager", use_cache=False)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{path} is not a loadable transformers model directory: {e}") from e


def _task_from_config(path: Path, config: Any) -> Task:
    for arch in getattr(config, "architectures", None) or ():
        for suffix, task in _ARCHITECTURE_TASK.items():
            if arch.endswith(suffix):
                return task
    tasks = ", ".join(t.value for t in Task)  # a causal LM: text-generation
    raise ModelLoadError(
        f"cannot tell the task of {path} from its config (architectures {getattr(config, 'architectures', None)}): "
        f"give --task ({tasks})"
    )


def _model(path: Path, task: Task, config: Any) -> Any:
    import transformers

    if task not in _AUTO_CLASS:
        raise ModelLoadError(f"task {task.value} is not compiled by the transformers directory frontend")
    auto = getattr(transformers, _AUTO_CLASS[task])
    try:
        model = auto.from_pretrained(path, config=config, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{_AUTO_CLASS[task]} cannot load {path} for task {task.value}: {e}") from e
    if task is Task.FEATURE_EXTRACTION and getattr(config, "is_encoder_decoder", False):
        # An encoder-decoder's features are its encoder's: the decoder needs a generation loop.
        model = model.get_encoder()
    return model.eval()


def _example_inputs(
    model: Any, config: Any, path: Path, dims: tuple[DimRange, ...]
) -> tuple[dict[str, Any], dict[str, dict[int, str]], dict[str, tuple[float, float]]]:
    """Example tensors for tracing, which axes are dynamic, and the value range of each id input."""
    import torch

    params = inspect.signature(model.forward).parameters
    batch = _trace_size(dims, DEFAULT_BATCH)
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        height, width = _image_size(config, path)
        pixels = torch.randn(batch, getattr(config, "num_channels", 3), height, width)
        return {"pixel_values": pixels}, {"pixel_values": {0: "batch"}}, {}
    if main == "input_features":  # speech encoders: fixed frame count (Whisper: 2 x max_source_positions)
        frames = 2 * int(config.max_source_positions)
        features = torch.randn(batch, int(config.num_mel_bins), frames)
        return {"input_features": features}, {"input_features": {0: "batch"}}, {}
    if main != "input_ids":
        raise ModelLoadError(f"{type(model).__name__} takes {main!r}: only text, image and speech models load here")
    seq = _trace_size(dims, _seq_range(config))
    vocab = int(config.vocab_size)
    inputs = {"input_ids": torch.randint(0, vocab, (batch, seq))}
    ranges = {"input_ids": (0.0, float(vocab))}
    if "attention_mask" in params:
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.int64)
    type_vocab = int(getattr(config, "type_vocab_size", 0) or 0)
    if "token_type_ids" in params and type_vocab > 1:  # RoBERTa's single segment has none, as in Optimum
        inputs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.int64)
        ranges["token_type_ids"] = (0.0, float(type_vocab))
    return inputs, {k: {0: "batch", 1: "seq"} for k in inputs}, ranges


def _seq_range(config: Any) -> DimRange:
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    # RoBERTa-style position ids start after padding_idx: only limit - padding_idx - 1 positions exist.
    if limit and getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        limit -= int(getattr(config, "pad_token_id", 1) or 1) + 1
    top = int(limit or DEFAULT_SEQ_MAX)
    return DimRange("seq", 1, min(DEFAULT_SEQ_OPT, top), top)


def _default_dims(
    config: Any, axes: Mapping[str, Mapping[int, str]], dims: tuple[DimRange, ...]
) -> tuple[DimRange, ...]:
    """The declared dims: ``--dynamic``'s, else the defaults, for each dim the model's inputs name."""
    given = {d.name: d for d in dims}
    defaults = {"batch": DEFAULT_BATCH, "seq": _seq_range(config)}
    used = dict.fromkeys(n for ax in axes.values() for n in ax.values())
    return tuple(given.get(n) or defaults[n] for n in used) + tuple(d for d in dims if d.name not in used)


def _trace_size(dims: tuple[DimRange, ...], default: DimRange) -> int:
    """The size to trace a dynamic dim at: its opt, but at least 2 (torch.export specialises 0 and 1)."""
    rng = next((d for d in dims if d.name == default.name), default)
    return min(max(rng.opt, 2), rng.max)


def _image_size(config: Any, path: Path) -> tuple[int, int]:
    """(height, width) the preprocessor produces (its crop, else its resize), else the config's image_size."""
    pre = path / "preprocessor_config.json"
    data = json.loads(pre.read_text()) if pre.is_file() else {}
    keys = ("crop_size", "size") if data.get("do_center_crop", True) else ("size",)
    for size in (data.get(k) for k in keys):
        if isinstance(size, int):
            return size, size
        if isinstance(size, Mapping) and "height" in size and "width" in size:
            return int(size["height"]), int(size["width"])
        if isinstance(size, Mapping) and "shortest_edge" in size:
            return int(size["shortest_edge"]), int(size["shortest_edge"])
    size = getattr(config, "image_size", None) or 224
    return (int(size[0]), int(size[1])) if isinstance(size, (list, tuple)) else (int(size), int(size))


def _dir_sha256(path: Path, task: Task) -> str:
    """Every file of the directory (weights, config, tokenizer), by sorted relative path, and the task."""
    digest = hashlib.sha256(task.value.encode())
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
