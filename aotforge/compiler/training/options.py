"""What a distillation run may spend and how it learns, and which grid a quantization-aware one trains through: the
typed options ``aotforge distill``'s and ``aotforge qat``'s flags come from."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DistillOptions:
    """What a distillation run may spend and how it learns."""

    #: Wall-clock budget of the training loop, minutes (the report's scoring comes after it).
    max_minutes: float = 10.0
    #: Process CPU-time budget of the training loop, CPU-minutes (all threads; 0: none). On a shared machine the
    #: honest budget: 2 cores for 10 minutes are 20 CPU-minutes whatever else runs there.
    max_cpu_minutes: float = 0.0
    #: At most this many optimizer steps, whichever of the two ends first.
    max_steps: int = 100_000
    #: Tokens per training sequence.
    seq_len: int = 256
    #: Sequences per step.
    batch: int = 8
    #: AdamW's peak learning rate (linear warm-up, then ``schedule``).
    lr: float = 3e-4
    warmup_steps: int = 20
    #: After the warm-up: ``constant``, or ``cosine``: decayed to 0 over the budget (the larger of the elapsed
    #: fractions of the wall, CPU and step budgets: a time-bounded run ends at a small learning rate wherever it stops).
    schedule: str = "constant"
    #: Softmax temperature of the response-based loss.
    temperature: float = 2.0
    #: Weight of the feature-based loss beside the response-based one (0: response-based only).
    feature_weight: float = 0.0
    #: Sequence-level distillation: the last this many tokens of each training sequence are the teacher's own greedy
    #: continuation of the text before them (what a draft's proposals are checked against); 0: the text only.
    continuation: int = 0
    #: With ``continuation``: how many sequences the teacher continues once, before the first step (batched through
    #: its cache, cached on disk, its cost counted in the budget); the steps draw their batches from them.
    pool: int = 512
    #: With ``continuation``: the teacher's largest logits kept per position; the loss is the KL divergence from its
    #: distribution over them (their softmax) to the student's.
    top_k: int = 16
    seed: int = 0
    #: Tokens the report scores on (never trained on).
    held_out_tokens: int = 2048

    def __post_init__(self) -> None:
        from aotforge.core.errors import OptionsError

        if self.schedule not in SCHEDULES:
            raise OptionsError(f"--schedule is one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not 0 <= self.continuation < self.seq_len:
            raise OptionsError(
                f"--continuation {self.continuation}: give 0 to {self.seq_len - 1} (fewer than --seq-len's tokens)"
            )
        if self.pool < 1 or self.top_k < 1:
            raise OptionsError(f"--pool {self.pool} / --top-k {self.top_k}: give at least 1 each")
        if self.continuation and self.feature_weight > 0:
            raise OptionsError(
                "--continuation and --feature-weight: the teacher's continuation is decoded step by step and keeps no "
                "hidden states to match; give one of the two"
            )


#: The learning-rate schedules after the warm-up.
SCHEDULES = ("constant", "cosine")


#: Quantization-aware training's defaults: a trained model fine-tuned (a small learning rate), its logits unsoftened,
#: a short warm-up, smaller batches (the fp32 teacher and the student both hold a full vocabulary's logits).
QAT_OPTIONS = DistillOptions(lr=1e-5, temperature=1.0, warmup_steps=5, batch=4)


def qat_targets() -> list[str]:
    """The targets whose weight-only rounding quantization-aware training reproduces (``Target.weight_grids``)."""
    from aotforge.targets import TARGETS, get_target

    return [name for name in TARGETS if get_target(name).weight_grids]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which grid each weight of a decoder trains through: the layers' matmuls at ``bits`` (``layers_8bit`` at 8),
    the LM head at ``head_bits``: what a ``weight-only`` build of ``target`` with the same parameters packs."""

    target: str = "onnxruntime"
    bits: int = 4
    block_size: int = 32
    head_bits: int = 8
    layers_8bit: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        from aotforge.core.errors import OptionsError

        known = qat_targets()
        if self.target not in known:
            raise OptionsError(f"--target: quantization-aware training knows {', '.join(known)}, not {self.target!r}")
        if self.bits not in (4, 8) or self.head_bits not in (4, 8):
            raise OptionsError(f"--bits / --head-bits are 4 or 8, got {self.bits} / {self.head_bits}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise OptionsError(f"--block-size is a power of two >= 16, got {self.block_size}")


@dataclasses.dataclass(frozen=True)
class FeatureDraftOptions:
    """How ``aotforge distill-draft`` trains a feature draft (``feature_draft.py``) and what it may spend. The pool's
    sizes (``seq_len``, ``continuation``, ``pool``, ``top_k``, ``seed``) are ``make bench-draft``'s token draft's: the
    same prompts continued (its features kept from that pass, so cached apart from the token draft's pool)."""

    #: Process CPU-time budget, CPU-minutes (all threads), the teacher's pool and features included: 2 cores for 15
    #: minutes, the issue's allowance for a draft.
    max_cpu_minutes: float = 30.0
    #: Wall-clock budget, minutes, the same counted; on a shared host the CPU budget is the one that binds.
    max_minutes: float = 60.0
    max_steps: int = 100_000
    #: The draft MLP's width f (the spec's ``intermediate_size``); 0: twice the teacher's hidden size.
    intermediate_size: int = 0
    #: Rows of the draft's head: the training text's most frequent tokens (``sub_vocab.py``).
    sub_vocab: int = 8192
    #: Chain steps trained per position: step 1 reads the teacher's feature, each later one the draft's own output.
    chain: int = 3
    #: Weight of chain step i's loss is ``chain_decay ** (i - 1)``.
    chain_decay: float = 0.7
    #: Positions (all chain steps of each) per optimizer step.
    batch: int = 2048
    #: Of those, at most this many are the positions whose logits the response and greedy losses read (a random
    #: subset: the batch's rows are drawn at random), the feature loss reading all; 0: the whole batch. The head's
    #: matmul over the sub-vocabulary and its softmax cost as much as the rest of a step: a subset buys more steps
    #: in a CPU-time budget, each with less of the logits' signal (the features still pull every position).
    logit_batch: int = 512
    lr: float = 1e-3
    warmup_steps: int = 20
    #: After the warm-up: ``constant``, or ``cosine``, decayed to 0 over the budget.
    schedule: str = "cosine"
    #: Weight of the response-based loss: the KL from the teacher's distribution over its ``top_k`` largest logits.
    response_weight: float = 1.0
    #: Weight of the cross-entropy on the teacher's greedy token (where the draft's head has it).
    greedy_weight: float = 0.0
    #: Weight of the feature-based loss: smooth-L1 from the draft's output to the teacher's next feature (EAGLE).
    feature_weight: float = 0.5
    temperature: float = 1.0
    #: The head trains (True) or stays the teacher's LM-head rows.
    train_head: bool = True
    #: Tokens per training sequence: text, then (``continuation``) the teacher's greedy continuation of it.
    seq_len: int = 128
    continuation: int = 64
    #: At most this many sequences the teacher continues greedily, up front (cached; on-distribution for greedy
    #: decoding; a prefill position costs about a third of a decoded one).
    pool: int = 768
    top_k: int = 16
    #: At most this many further windows of plain training text (``seq_len`` tokens each) beside the pool; 0: none.
    text_windows: int = 1024
    #: The teacher's data stops at these shares of the run's budget (made in chunks, so the chunk that crosses a
    #: share is finished): the pool at ``pool_share``, the pool and the text windows together at ``data_share``;
    #: the rest of the budget trains. The counts above and the shares bound the data, whichever ends it first.
    pool_share: float = 0.15
    data_share: float = 0.3
    seed: int = 0
    #: Held-out text whose first tokens prompt the held-out continuations the report's chain is scored on.
    held_out_tokens: int = 2048

    def __post_init__(self) -> None:
        from aotforge.core.errors import OptionsError

        if self.schedule not in SCHEDULES:
            raise OptionsError(f"--schedule is one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not 0 < self.continuation < self.seq_len:
            raise OptionsError(f"--continuation {self.continuation}: give 1 to {self.seq_len - 1}")
        if not 1 <= self.chain < self.continuation or self.continuation < 4:
            raise OptionsError(
                f"--chain {self.chain} / --continuation {self.continuation}: give a chain of 1 to --continuation - 1 "
                "and a --continuation of at least 4 (the report scores chains of 3)"
            )
        if (
            min(self.pool, self.top_k, self.batch) < 1
            or min(self.intermediate_size, self.logit_batch) < 0
            or self.text_windows < 0
        ):
            raise OptionsError(
                "--pool, --top-k and --batch are at least 1, --intermediate-size, --logit-batch and --text-windows 0+"
            )
        if self.response_weight + self.greedy_weight + self.feature_weight <= 0:
            raise OptionsError("give a positive --response-weight, --greedy-weight or --feature-weight")
        if not 0 < self.pool_share <= self.data_share < 1:
            raise OptionsError(
                f"--pool-share {self.pool_share:g} / --data-share {self.data_share:g}: give 0 < pool share <= data "
                "share < 1 (the rest of the budget trains)"
            )
