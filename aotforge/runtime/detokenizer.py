"""Token ids to text one token at a time, never splitting a UTF-8 character, holding back a possible stop string.

As vLLM's incremental detokenization: the new text is the decode of a short window of recent tokens minus
the decode of the same window without the newest ones, so a multi-byte character made of several tokens
(the tokenizer's U+FFFD until it is whole) is emitted once, whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer: Any | None, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        #: all text so far, and how much of it went out
        self.text = ""
        self._sent = 0

    def add(self, token_id: int) -> None:
        self.ids.append(token_id)
        if self.tokenizer is None:
            return
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        full = decode(self.ids[self._prefix_offset :], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            self.text += full[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)

    def find_stop(self) -> int:
        """Where the first stop string starts in the text (-1 if none has appeared)."""
        if not self.stop:
            return -1
        hits = [i for i in (self.text.find(s, max(0, self._sent - len(s))) for s in self.stop) if i >= 0]
        return min(hits) if hits else -1

    def take(self, final: bool) -> str:
        """The text not yet sent, up to a stop string (cut there), holding back a tail that may still
        become one unless ``final``."""
        cut = self.find_stop()
        if cut >= 0:
            self.text = self.text[:cut]
            final = True
        end = len(self.text)
        if not final and self.stop:
            hold = max(len(s) for s in self.stop) - 1
            end = max(self._sent, end - hold)
        new = self.text[self._sent : end]
        self._sent = end
        return new
