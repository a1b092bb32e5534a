"""The runner a generative artifact loads into: the target's step engine, and its model runner for the runtime.

``aotforge.load(path).generate()`` / ``stream()`` run on the runtime's engine over :meth:`model_runner`
(``runtime/offline.py``), as do the build's validation and benchmark; ``generate`` / ``stream`` here are the step
engine's own loop, which speculative decoding (a draft) and device targets without a model runner still use, and
``perplexity`` (fixed batches of whole windows, scored at every position: the engine returns no logits)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import numpy as np

from aotforge.core.errors import InputSpecError
from aotforge.targets.base import Arrays
from aotforge.targets.generative.decoding import StepEngine, StopIds, generate_tokens, stream_tokens
from aotforge.targets.generative.feature_draft import FeatureDraft
from aotforge.targets.generative.perplexity import Perplexity, perplexity
from aotforge.targets.generative.sampling import SamplingOptions
from aotforge.targets.generative.speculative import VerifyEngine, generate_speculative, stream_speculative


class GenerativeRunner:
    """``run`` is the prefill graph by its input names; ``generate`` / ``stream`` decode with the cache."""

    def __init__(self, engine: StepEngine) -> None:
        self.engine = engine
        self.spec = engine.spec
        #: After a speculative call: proposed / accepted draft tokens, acceptance_rate, rounds, draft calls.
        self.speculative_stats: dict[str, Any] = {}
        self._model_runner: Any = None

    def model_runner(self, num_slots: int) -> Any:
        """The serving runtime's runner (``runtime.runner.ModelRunner``) with a cache of ``num_slots`` slots, kept
        for the next call of the same width (its cache is allocated once, as the step engine keeps its buffers)."""
        if self._model_runner is None or self._model_runner.max_rows != num_slots:
            self._model_runner = None  # the old cache goes before the new one is allocated
            self._model_runner = cast(Any, self.engine).model_runner(num_slots)  # the CPU targets' step engines
        return self._model_runner

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
        eos_token_id: StopIds = None,
        draft: GenerativeRunner | FeatureDraft | None = None,
        num_speculative_tokens: int | None = None,
    ) -> np.ndarray:
        """``[batch, prompt + new tokens]``: the prompts as given, then what was decoded; a row stops at one of
        ``eos_token_id`` (an id or several; none: every row runs to ``max_new_tokens``) and repeats it.

        With ``draft`` (another text-generation runner over the same vocabulary, or a feature draft of this
        artifact's model: ``feature_draft``), speculative decoding: the draft proposes ``num_speculative_tokens``
        (default: as many as the verify graph takes) and this artifact's verify graph checks them (``speculative``)."""
        sampling = SamplingOptions(do_sample, temperature, top_k, top_p, seed)
        if draft is None:
            return generate_tokens(self.engine, input_ids, max_new_tokens, attention_mask, sampling, eos_token_id)
        engine, k = self._speculative(draft, num_speculative_tokens)
        return generate_speculative(
            engine, _proposing(draft), input_ids, max_new_tokens, k, attention_mask, sampling, eos_token_id,
            self.speculative_stats,
        )  # fmt: skip

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
        eos_token_id: StopIds = None,
        draft: GenerativeRunner | FeatureDraft | None = None,
        num_speculative_tokens: int | None = None,
    ) -> Iterator[np.ndarray]:
        """Each step's new tokens ``[batch]`` as soon as they are decoded (a speculative round's all at once)."""
        sampling = SamplingOptions(do_sample, temperature, top_k, top_p, seed)
        if draft is None:
            return stream_tokens(self.engine, input_ids, max_new_tokens, attention_mask, sampling, eos_token_id)
        engine, k = self._speculative(draft, num_speculative_tokens)
        return stream_speculative(
            engine, _proposing(draft), input_ids, max_new_tokens, k, attention_mask, sampling, eos_token_id,
            self.speculative_stats,
        )  # fmt: skip

    def _speculative(
        self, draft: GenerativeRunner | FeatureDraft, num_speculative_tokens: int | None
    ) -> tuple[VerifyEngine, int]:
        """This runner's engine as a verify engine and the number of draft tokens per round; refusals first."""
        width = int(getattr(self.engine, "verify_width", 0))
        if not width:
            raise InputSpecError(
                "this artifact has no verify graph for speculative decoding: rebuild it with --speculative-k K "
                "(speculative_k=K), or generate without a draft"
            )
        if draft is self:
            raise InputSpecError("the draft must be another loaded artifact (each needs its own KV cache)")
        self.speculative_stats = {}
        return self.engine, width - 1 if num_speculative_tokens is None else num_speculative_tokens  # type: ignore[return-value]

    def perplexity(self, input_ids: np.ndarray, window: int | None = None) -> Perplexity:
        """Perplexity of a token sequence, in non-overlapping windows (default ``max_seq_len + 1`` tokens)."""
        return perplexity(self.engine, input_ids, window)


def _proposing(draft: GenerativeRunner | FeatureDraft) -> StepEngine | FeatureDraft:
    """What proposes for ``draft``: a draft artifact's step engine, or the feature draft itself."""
    return draft if isinstance(draft, FeatureDraft) else draft.engine
