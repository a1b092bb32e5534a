"""Pipeline parallelism: a causal LM cut into ``degree`` stage models, each over a contiguous run of its layers.

Stage ``s`` holds layers ``bounds[s] .. bounds[s+1]``, the embedding on the first stage, the final norm and the
head on the last (GPipe's and vLLM's ``get_pp_indices`` split). A stage model is the source model with its
``layers`` cut, so the exporter traces each family's own layers as it does unsharded; what crosses a stage
boundary goes through two ops that export as one ONNX node each (``collectives``): ``stage_send`` where the
final norm was (the whole sequence's hidden states, before any token is picked) and ``stage_recv`` where the
embedding was. A stage graph keeps the unsharded graphs' inputs and outputs (its ``logits`` are one column wide
except on the last stage), so each stage runs on the unsharded runtime's engine and runner.

The split balances parameters, not layer counts: the head of a small model weighs as much as several layers
(SmolLM2: 28 M parameters against 3.5 M a layer), and a decode step streams every weight once.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from aotforge.compiler.generative.collectives import stage_recv, stage_send
from aotforge.core.errors import OptionsError, UnsupportedModelError

#: Families whose base model the cutting below knows (``layers`` / ``norm`` / ``embed_tokens``; GPT-2's
#: ``h`` / ``ln_f`` / ``wte`` + ``wpe``).
LLAMA_LIKE = ("llama", "qwen2", "mistral")
GPT2_LIKE = ("gpt2",)


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """Which layers each of ``degree`` stages holds: stage ``s`` runs ``bounds[s] .. bounds[s+1] - 1``."""

    degree: int
    bounds: tuple[int, ...]
    hidden: int
    vocab: int

    def layers(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    def to_dict(self) -> dict[str, Any]:
        return {"degree": self.degree, "bounds": list(self.bounds), "hidden": self.hidden, "vocab": self.vocab}


def _blocks(model: Any) -> Any:
    base = model.base_model
    return base.h if model.config.model_type in GPT2_LIKE else base.layers


def _params(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def plan(model: Any, degree: int, name: str) -> StagePlan:
    """The split of ``model`` into ``degree`` stages; more stages than layers, or an unknown family, refused."""
    family = str(getattr(model.config, "model_type", ""))
    if family not in LLAMA_LIKE + GPT2_LIKE:
        raise UnsupportedModelError(
            f"--pipeline-parallel: {name} is a {family or type(model).__name__} model; pipeline-parallel builds "
            f"know the layers of {', '.join(LLAMA_LIKE + GPT2_LIKE)}: build it with --pipeline-parallel 1"
        )
    blocks = _blocks(model)
    if degree < 1 or degree > len(blocks):
        raise OptionsError(
            f"--pipeline-parallel {degree}: {name} has {len(blocks)} decoder layers and each stage needs at least "
            f"one: choose a degree of 1 to {len(blocks)}"
        )
    costs = [_params(b) for b in blocks]
    costs[-1] += _params(model.get_output_embeddings())  # the last stage's head streams with its layers
    hidden = int(getattr(model.config, "hidden_size", 0) or model.config.n_embd)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return StagePlan(degree, _balanced(costs, degree), hidden, vocab)


def _balanced(costs: list[int], parts: int) -> tuple[int, ...]:
    """Cut points of ``costs`` into ``parts`` contiguous non-empty runs, the largest run's sum smallest
    (a binary search over that sum, greedy runs inside it)."""

    def cuts(limit: int) -> list[int] | None:
        bounds, total = [0], 0
        for i, cost in enumerate(costs):
            if total and total + cost > limit:
                bounds.append(i)
                total = 0
            total += cost
        return bounds if len(bounds) <= parts else None

    lo, hi = max(costs), sum(costs)
    while lo < hi:
        mid = (lo + hi) // 2
        if cuts(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    bounds = cuts(lo) or [0]
    # Fewer runs than parts (a limit loose enough for fewer): split the largest runs until every stage has a layer.
    while len(bounds) < parts:
        ends = [*bounds[1:], len(costs)]
        widest = max(range(len(bounds)), key=lambda j: (ends[j] - bounds[j] > 1, sum(costs[bounds[j] : ends[j]])))
        bounds.insert(widest + 1, bounds[widest] + (ends[widest] - bounds[widest]) // 2)
    return (*bounds, len(costs))


class _Send(torch.nn.Module):
    """Where a non-last stage's final norm was: the hidden states go to the next stage, unchanged."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return stage_send(hidden)


class _Recv(torch.nn.Module):
    """Where a non-first stage's embedding was: the hidden states from the stage before, one per token."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.register_buffer("like", torch.zeros(hidden))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return stage_recv(input_ids, self.like)


class _NoPositions(torch.nn.Module):
    """GPT-2's position table past the first stage: the hidden states it receives already hold the positions."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*position_ids.shape, self.hidden)


class _NoHead(torch.nn.Module):
    """A non-last stage's head: one column, so the graph keeps the ``logits`` output at no cost (never read)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[..., :1]


def stage_model(model: Any, stages: StagePlan, stage: int) -> Any:
    """A copy of ``model`` holding stage ``stage``'s layers, what crosses its boundaries sent and received."""
    layers = stages.layers(stage)
    gpt2 = model.config.model_type in GPT2_LIKE
    # Copy only what the stage keeps: the other layers are swapped out of the source for the copy's duration.
    blocks = _blocks(model)
    base = model.base_model
    name = "h" if gpt2 else "layers"
    setattr(base, name, torch.nn.ModuleList([blocks[i] for i in layers]))
    try:
        part = copy.deepcopy(model)
    finally:
        setattr(base, name, blocks)
    part.config.num_hidden_layers = len(layers)
    if getattr(part.config, "layer_types", None) is not None:
        part.config.layer_types = [part.config.layer_types[i] for i in layers]
    for local, block in enumerate(_blocks(part)):
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = local  # each stage's cache holds only its layers, numbered from 0
    if stage > 0:
        part.set_input_embeddings(_Recv(stages.hidden))
        if gpt2:
            part.base_model.wpe = _NoPositions(stages.hidden)
    if stage < stages.degree - 1:
        if gpt2:
            part.base_model.ln_f = _Send()
        else:
            part.base_model.norm = _Send()
        part.set_output_embeddings(_NoHead())
    return part.eval()
