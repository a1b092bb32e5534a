"""The teacher's side of a distillation step: its next-token logits over the student's vocabulary, on the text, or on
the text followed by its own greedy continuation (sequence-level distillation, Kim & Rush 2016: a draft's proposals
are checked against the teacher's greedy tokens after the teacher's own text, so that is the text it learns from).

The teacher runs without gradients, in bfloat16 where the CPU computes it natively (a copy cast once, not every
weight on every step as autocast does), and its head computes only the rows of the student's tokens: with a
draft's reduced vocabulary most of the head's matmul, a fifth of a small model's work, is skipped."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

#: Positions whose full-vocabulary logits ``Teacher.greedy`` holds at once.
GREEDY_ROWS = 512


class Teacher:
    """``model`` (a causal LM) as the source of a distillation's targets, over the tokens ``ids`` (None: all)."""

    def __init__(self, model: Any, ids: np.ndarray | None, dtype: Any | None) -> None:
        import torch

        #: What the teacher's outputs depend on (``teacher_data.py``'s cache key): its weights as given, the dtype it
        #: runs in, the student's tokens.
        self.source_state, self.dtype, self.ids = model.state_dict(), dtype, ids
        if dtype is not None:
            model = copy.deepcopy(model).to(dtype)
        model.eval().requires_grad_(False)
        self.model = model
        self.base = getattr(model, model.base_model_prefix)
        head = model.get_output_embeddings()
        self.weight, self.bias = head.weight, head.bias
        rows = torch.from_numpy(ids) if ids is not None else None
        self.sub_weight = self.weight if rows is None else self.weight[rows]
        self.sub_bias = self.bias if self.bias is None or rows is None else self.bias[rows]

    def logits(self, input_ids: Any) -> Any:
        """``[batch, len, student vocab]`` fp32: the teacher's next-token logits at every position."""
        import torch

        with torch.no_grad():
            return self.sub_logits(self.base(input_ids=input_ids).last_hidden_state)

    def continue_greedy(self, prompt: Any, new_tokens: int) -> tuple[Any, Any]:
        """``prompt [batch, p]`` followed by the teacher's ``new_tokens`` greedy tokens (argmax over its whole
        vocabulary, through its own cache), and its logits at every position of that sequence (one pass: each
        position's logits are computed once, by the prefill or by the step that reads the token there)."""
        import torch

        with torch.no_grad():
            out = self.base(input_ids=prompt, use_cache=True)
            tokens, logits = [prompt], [self.sub_logits(out.last_hidden_state)]
            for _ in range(new_tokens):
                last = out.last_hidden_state[:, -1:]
                token = torch.nn.functional.linear(last, self.weight, self.bias).argmax(-1)
                out = self.base(input_ids=token, cache=out.cache, use_cache=True)
                tokens.append(token)
                logits.append(self.sub_logits(out.last_hidden_state))
            return torch.cat(tokens, 1), torch.cat(logits, 1)

    def continue_greedy_hidden(self, prompt: Any, new_tokens: int) -> tuple[Any, Any, Any]:
        """``continue_greedy``'s tokens with what a feature draft learns from, in the same pass: the LM-head input at
        every position of the sequence, and the teacher's greedy next token there (over its whole vocabulary; the
        last position's is one past the sequence)."""
        import torch

        with torch.no_grad():
            out = self.base(input_ids=prompt, use_cache=True)
            hidden = [out.last_hidden_state]
            greedy = [self.greedy(hidden[0])]
            tokens = [prompt]
            for _ in range(new_tokens):
                token = greedy[-1][:, -1:]
                out = self.base(input_ids=token, cache=out.cache, use_cache=True)
                tokens.append(token)
                hidden.append(out.last_hidden_state)
                greedy.append(self.greedy(out.last_hidden_state))
            return torch.cat(tokens, 1), torch.cat(hidden, 1), torch.cat(greedy, 1)

    def greedy(self, hidden: Any) -> Any:
        """The teacher's greedy next token (its id) from the LM-head input ``hidden [batch, len, d]``, a few rows of
        full-vocabulary logits at a time."""
        import torch

        rows = max(1, GREEDY_ROWS // max(1, hidden.shape[1]))
        picks = [
            torch.nn.functional.linear(hidden[i : i + rows], self.weight, self.bias).argmax(-1)
            for i in range(0, len(hidden), rows)
        ]
        return torch.cat(picks)

    def sub_logits(self, hidden: Any) -> Any:
        """fp32 logits of the student's tokens from the LM-head input ``hidden``."""
        import torch

        return torch.nn.functional.linear(hidden, self.sub_weight, self.sub_bias).float()
