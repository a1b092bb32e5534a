"""The trained pair (tests/lm_pair.py) has learned the text: what the perplexity gates and speculative tests rely on."""

from __future__ import annotations

import pytest

from tests.lm_bytes import VOCAB, byte_tokenizer, decode, encode
from tests.lm_pair import LmPair, greedy_acceptance


def test_byte_tokenizer_round_trips_utf8() -> None:
    text = 'def héllo(x):\n    """Return ✓."""\x00\x7f'
    tokenizer = byte_tokenizer()
    assert tokenizer(text)["input_ids"] == encode(text) and tokenizer.decode(encode(text)) == text
    assert decode(encode(text)) == text and len(tokenizer) == VOCAB


@pytest.mark.slow  # trains the pair on a cold cache (~146 s on 2 quiet cores, ~290 s of CPU)
def test_the_pair_has_learned_the_held_out_text(lm_pair: LmPair) -> None:
    """Held-out perplexity far below the uniform 264 (target 5.87, draft 8.41 as trained here), the draft
    worse than the target, and greedy speculation with k=4 keeping a third or more of the draft's tokens
    (0.59 and 0.51 on these two prompts; 77% over the speculative bench's four)."""
    import transformers

    assert lm_pair.target_ppl < lm_pair.draft_ppl < 10
    assert lm_pair.target_dir.joinpath("tokenizer.json").is_file()
    target = transformers.LlamaForCausalLM.from_pretrained(lm_pair.target_dir).eval()
    draft = transformers.LlamaForCausalLM.from_pretrained(lm_pair.draft_dir).eval()
    assert target.config.tie_word_embeddings is False and draft.config.tie_word_embeddings is True
    ids = encode(lm_pair.heldout_text)
    rates = [greedy_acceptance(target, draft, ids[o : o + 64], 64, k=4)["acceptance_rate"] for o in (0, 6000)]
    assert min(rates) > 0.3 and sum(rates) / len(rates) > 0.4, rates
