"""What a distillation run may spend and how it learns: the typed options ``aotforge distill``'s flags come from."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DistillOptions:
    """What a distillation run may spend and how it learns."""

    #: Wall-clock budget of the training loop, minutes (the report's scoring comes after it).
    max_minutes: float = 10.0
    #: At most this many optimizer steps, whichever of the two ends first.
    max_steps: int = 100_000
    #: Tokens per training sequence.
    seq_len: int = 256
    #: Sequences per step.
    batch: int = 8
    #: AdamW's peak learning rate (linear warm-up, then constant).
    lr: float = 3e-4
    warmup_steps: int = 20
    #: Softmax temperature of the response-based loss.
    temperature: float = 2.0
    #: Weight of the feature-based loss beside the response-based one (0: response-based only).
    feature_weight: float = 0.0
    seed: int = 0
    #: Tokens the report scores on (never trained on).
    held_out_tokens: int = 2048
