"""What a text-generation artifact's carried model files say about generating with it: its tokenizer, and the
end-of-sequence ids where generation stops unless told otherwise (``generate()``, ``aotforge generate``, serving)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aotforge.core.decoder import GENERATION_CONFIG_FILE


def load_tokenizer(path: Path) -> Any | None:
    """The tokenizer the artifact carries (its model directory's files), or None."""
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def eos_token_ids(path: Path, tokenizer: Any | None = None) -> tuple[int, ...]:
    """Where generation stops by default: the model's generation config's end-of-sequence ids (one, or a list),
    else its tokenizer's (``tokenizer``, or the one the artifact carries, loaded only then); none when the artifact
    carries neither."""
    config = path / GENERATION_CONFIG_FILE
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token_id")
        if eos is not None:
            return tuple(int(t) for t in eos) if isinstance(eos, list) else (int(eos),)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return (int(tokenizer.eos_token_id),)
    return ()
