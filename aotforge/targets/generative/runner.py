"""The runner a generative artifact loads into: ``generate`` / ``stream`` over a target's step engine."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from aotforge.targets.base import Arrays
from aotforge.targets.generative.decoding import StepEngine, generate_tokens, stream_tokens
from aotforge.targets.generative.sampling import SamplingOptions


class GenerativeRunner:
    """``run`` is the prefill graph by its input names; ``generate`` / ``stream`` decode with the cache."""

    def __init__(self, engine: StepEngine) -> None:
        self.engine = engine
        self.spec = engine.spec

    def run(self, inputs: Arrays) -> Arrays:
        ids = np.asarray(inputs["input_ids"])
        self.engine.start(ids.shape[0], ids.shape[1])
        logits = self.engine.prefill(ids, np.asarray(inputs["attention_mask"]), np.asarray(inputs["position_ids"]))
        return {"logits": logits}

    def generate(
        self,
        input_ids: np.ndarray,
        max_new_tokens: int,
        attention_mask: np.ndarray | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_token_id: int | None = None,
    ) -> np.ndarray:
        """``[batch, prompt + new tokens]``: the prompts as given, then what was decoded."""
        sampling = SamplingOptions(do_sample, temperature, top_k, top_p, seed)
        return generate_tokens(self.engine, input_ids, max_new_tokens, attention_mask, sampling, eos_token_id)

    def stream(
        self,
        input_ids: np.ndarray,
        max_new_tokens: int,
        attention_mask: np.ndarray | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_token_id: int | None = None,
    ) -> Iterator[np.ndarray]:
        """Each step's new tokens ``[batch]`` as soon as they are decoded."""
        sampling = SamplingOptions(do_sample, temperature, top_k, top_p, seed)
        return stream_tokens(self.engine, input_ids, max_new_tokens, attention_mask, sampling, eos_token_id)
