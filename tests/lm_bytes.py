"""The byte vocabulary of the trained pair (``tests/lm_pair.py``): ids 0-255 are the UTF-8 bytes, then ``BOS``,
``EOS``, ``PAD`` and reserved ids up to ``VOCAB`` (264, a multiple of 8). :func:`encode` / :func:`decode` convert
text; :func:`byte_tokenizer` is the same vocabulary as a transformers tokenizer."""

from __future__ import annotations

from typing import Any

VOCAB = 264
BOS, EOS, PAD = 256, 257, 258


def encode(text: str, bos: bool = False) -> list[int]:
    return ([BOS] if bos else []) + list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def byte_tokenizer() -> Any:
    """A transformers tokenizer whose ids are the UTF-8 bytes (what ``encode`` gives), saved beside the weights.

    ``tokenizers``' ByteLevel pre-tokenizer maps each byte to one printable character (GPT-2's table),
    split into single characters, each looked up in a word-level vocabulary that maps it back to its byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    shifted = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(shifted)}
    vocab = {chars[b]: b for b in range(256)} | {"<s>": BOS, "</s>": EOS, "<pad>": PAD}
    vocab |= {f"<reserved_{i}>": i for i in range(PAD + 1, VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False), pre_tokenizers.Split("", "isolated")]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
