"""The token streams a training run reads: the user's text files, or English that ships with Python, tokenized
with the teacher's tokenizer, split into a training part and a held-out tail that the report scores on."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.compiler.generative.quality import CORPUS_MODULES, default_corpus
from aotforge.core.errors import InputSpecError

#: Stdlib modules whose docstrings are the default training text: none of the quality gate's held-out
#: :data:`~aotforge.compiler.generative.quality.CORPUS_MODULES`, so a build's gate never scores training text.
TRAIN_MODULES = (
    "collections", "json", "logging", "pathlib", "subprocess", "typing", "functools", "itertools", "datetime",
    "decimal", "email.message", "http.client", "unittest.case", "shutil", "os", "re", "random", "zipfile", "csv",
    "threading", "asyncio.tasks", "inspect", "ast", "enum", "dataclasses", "tarfile", "urllib.parse", "socket",
)  # fmt: skip
assert not set(TRAIN_MODULES) & set(CORPUS_MODULES)


@dataclasses.dataclass(frozen=True)
class TokenStreams:
    train: np.ndarray
    held_out: np.ndarray
    #: What the report says of the text: where it came from, its sha256, token counts.
    about: dict[str, Any]


def token_streams(files: tuple[Path, ...], tokenizer: Any, held_out_tokens: int) -> TokenStreams:
    """``files`` (or :data:`TRAIN_MODULES`' docstrings) as one token stream, its last ``held_out_tokens`` held out
    (the default text's held-out part is the quality gate's corpus instead: text no model was trained on)."""
    if files:
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise InputSpecError(f"--text: no such file {', '.join(missing)}")
        text = "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
        source = ", ".join(str(f) for f in files)
        ids = _ids(tokenizer, text)
        if len(ids) < 4 * held_out_tokens:
            raise InputSpecError(
                f"--text gives {len(ids)} tokens: too few to train on and hold out {held_out_tokens}; "
                "give more text (at least 4x the held-out tokens)"
            )
        train, held_out = ids[:-held_out_tokens], ids[-held_out_tokens:]
    else:
        text = default_corpus(TRAIN_MODULES)
        source = f"docstrings of the stdlib modules {', '.join(TRAIN_MODULES)}"
        train = _ids(tokenizer, text)
        held_out = _ids(tokenizer, default_corpus())[:held_out_tokens]
    about = {
        "text": source,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "train_tokens": int(len(train)),
        "held_out_tokens": int(len(held_out)),
    }
    return TokenStreams(train, held_out, about)


def _ids(tokenizer: Any, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
