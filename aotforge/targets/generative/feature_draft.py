"""A feature draft (issue 31's contract, ``notes/feature_draft_spec``): an attention-free head that reads the
target's own LM-head input ``h`` (Hydra, Ankner et al. 2024; EAGLE, Li et al. 2024) and predicts the next one.

One step, batched over slots: ``(h_t, x_{t+1}) -> (y, logits over the sub-vocabulary)``, ``y`` the predicted
``h_{t+1}``; a chain of ``k`` feeds each ``(y, proposal)`` back. It has no cache, so it costs a few small matmuls
a proposal (in int8: ``feature_draft_step``) and nothing to roll back. The directory holds ``feature_draft.json``
(sizes, target, the training report) and ``weights.safetensors`` (float32, read with ``safetensors.numpy``: no
torch at run time).
``save_feature_draft`` writes one (the trainer's and the tests'); ``load_feature_draft`` reads it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.errors import DraftMismatchError, InputSpecError

CONFIG_FILE = "feature_draft.json"
WEIGHTS_FILE = "weights.safetensors"
FORMAT = "aotforge-feature-draft"
VERSION = 1
#: Each weight's shape in the sizes ``d`` (hidden), ``f`` (MLP width), ``n`` (sub-vocabulary), ``V`` (vocabulary).
SHAPES = {
    "embed": ("V", "d"),
    "fc": ("d", "2d"),
    "fc_bias": ("d",),
    "norm": ("d",),
    "gate": ("f", "d"),
    "up": ("f", "d"),
    "down": ("d", "f"),
    "head": ("n", "d"),
    "vocab_ids": ("n",),
}


@dataclasses.dataclass(frozen=True)
class FeatureDraft:
    """The draft's weights (``SHAPES``) and its ``feature_draft.json`` (``config``)."""

    weights: Mapping[str, np.ndarray]
    config: Mapping[str, Any]

    @property
    def hidden_size(self) -> int:
        return int(self.weights["norm"].shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.weights["embed"].shape[0])

    def step(self, hidden: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What speculative decoding proposes with: :meth:`reference_step` as an int8 graph on ONNX Runtime
        (``feature_draft_step``: a quarter of the bytes to read a proposal), built on the first call."""
        return self._compiled(hidden, tokens)

    @functools.cached_property
    def _compiled(self) -> Any:
        from aotforge.targets.generative.feature_draft_step import CompiledStep

        return CompiledStep(self.weights, float(self.config["rms_eps"]))

    def reference_step(self, hidden: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``hidden [B, d]`` and the tokens they produced ``[B]`` (target ids) -> the predicted next hidden
        ``[B, d]`` and the logits over the sub-vocabulary ``[B, n]`` (``vocab_ids`` maps them to target ids), in
        float32: the format's contract, which the trainer's forward and the compiled step are checked against."""
        w = self.weights
        z = np.concatenate([w["embed"][tokens], hidden], axis=-1) @ w["fc"].T + w["fc_bias"]
        r = z / np.sqrt(np.mean(z * z, axis=-1, keepdims=True) + float(self.config["rms_eps"])) * w["norm"]
        gate = r @ w["gate"].T
        silu = gate * (0.5 + 0.5 * np.tanh(0.5 * gate))  # x * sigmoid(x), without exp's overflow
        y = z + (silu * (r @ w["up"].T)) @ w["down"].T
        return y, y @ w["head"].T

    def check_target(self, hidden_size: int, vocab: int, who: str) -> None:
        """Refuse a target (``who``) whose LM-head input or vocabulary differs from what this draft was made for."""
        if (hidden_size, vocab) != (self.hidden_size, self.vocab_size):
            target = self.config.get("target", {}).get("name_or_path", "?")
            raise DraftMismatchError(
                f"the feature draft was made for a target of hidden size {self.hidden_size} and {self.vocab_size} "
                f"tokens ({target}), {who} has hidden size {hidden_size} and {vocab} tokens: distill a feature draft "
                "from this target's own model (`aotforge distill-draft`)"
            )


def load_feature_draft(path: str | Path) -> FeatureDraft:
    """The feature draft in directory ``path`` (its weights in memory), its sizes checked against its config."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
        weights = load_file(os.fspath(path / WEIGHTS_FILE))
    except (OSError, ValueError, SafetensorError) as e:
        raise InputSpecError(
            f"{path} is not a readable feature draft ({CONFIG_FILE} and {WEIGHTS_FILE}): {e}; write it with "
            "`aotforge distill-draft` (or feature_draft.save_feature_draft)"
        ) from e
    if config.get("format") != FORMAT or config.get("version") != VERSION:
        raise InputSpecError(
            f"{path / CONFIG_FILE} is not an {FORMAT} v{VERSION} file (format {config.get('format')!r}, version "
            f"{config.get('version')!r}): write it again with this aotforge's `aotforge distill-draft`"
        )
    _check_shapes(weights, config, path)
    return FeatureDraft(weights, config)


def _check_shapes(weights: Mapping[str, np.ndarray], config: Mapping[str, Any], where: Path | str) -> None:
    sizes = {k: int(config[key]) for k, key in (("d", "hidden_size"), ("f", "intermediate_size"))}
    sizes |= {"V": int(config["vocab_size"]), "n": int(config["sub_vocab"]), "2d": 2 * int(config["hidden_size"])}
    for name, dims in SHAPES.items():
        want = tuple(sizes[d] for d in dims)
        got = tuple(weights[name].shape) if name in weights else None
        if got != want:
            raise InputSpecError(
                f"feature draft {where}: weight {name} has shape {got}, its config says {want}: the files do not "
                "belong together; write the draft again"
            )


def save_feature_draft(
    path: str | Path,
    weights: Mapping[str, np.ndarray],
    *,
    rms_eps: float,
    target: Mapping[str, Any],
    training: Mapping[str, Any] | None = None,
) -> Path:
    """Write a feature draft directory: ``weights`` by ``SHAPES``' names (float32; ``vocab_ids`` int64),
    ``target`` (``model_type``, ``hidden_size``, ``vocab_size``, ``name_or_path``) and ``training`` (the
    distill report) into its config. The sizes are read from the weights. Returns ``path``."""
    from safetensors.numpy import save_file

    path = Path(path)
    arrays = {
        name: np.ascontiguousarray(weights[name], dtype=np.int64 if name == "vocab_ids" else np.float32)
        for name in SHAPES
    }
    (n, d), f = arrays["head"].shape, arrays["gate"].shape[0]
    config = {
        "format": FORMAT,
        "version": VERSION,
        "hidden_size": d,
        "intermediate_size": f,
        "vocab_size": arrays["embed"].shape[0],
        "sub_vocab": n,
        "rms_eps": float(rms_eps),
        "target": dict(target),
        "training": dict(training or {}),
    }
    _check_shapes(arrays, config, path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(arrays, os.fspath(path / WEIGHTS_FILE))
    (path / CONFIG_FILE).write_text(json.dumps(config, sort_keys=True, indent=1) + "\n")
    return path


def is_feature_draft(path: Any) -> bool:
    """Whether ``path`` (a path, or anything else a ``draft=`` may be) is a feature draft directory."""
    return isinstance(path, str | os.PathLike) and (Path(path) / CONFIG_FILE).is_file()
