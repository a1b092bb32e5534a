"""Tensor parallelism: a causal LM cut into ``degree`` rank models, each over 1/degree of the weights.

The layout is Megatron's, as TensorRT-LLM and vLLM shard (``ColumnParallelLinear`` / ``RowParallelLinear`` /
``VocabParallelEmbedding``): the attention split by key/value-head groups (each rank keeps whole GQA groups,
its query heads with their key/value head), Q/K/V and gate/up column-parallel (rows of the weight), the
output and down projections row-parallel (columns) followed by an all-reduce and then their bias, the
embedding and the head split over the vocabulary (the embedding's lookups all-reduced, the head's logits
gathered by the runtime). Norms and GPT-2's position table are replicated. Each rank model is the source
model with sliced parameters, so the exporter traces each family's own layers as it does unsharded.

Sequence parallelism (Megatron's, as NxD Inference runs it in context encoding): in the prefill graph only, the
residual stream between the tensor-parallel regions is split along the prompt. Each row-parallel output (and the
embedding's) is reduce-scattered instead of all-reduced, so the residual add and the next norm run on the rank's
``ceil(T / N)`` positions; the norm's output is all-gathered back to the whole prompt before the column-parallel
projections read it. The decode and verify graphs (a few tokens) keep the all-reduce: what these modules trace to
with :class:`SequenceSplit` off, which the build exports from the plain rank model (``tp_build``), so that a
sequence-parallel build and a plain one of the same model share those exports.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from aotforge.compiler.generative.collectives import all_gather, all_reduce, reduce_scatter, sequence_slice
from aotforge.compiler.generative.graphs import kv_shape
from aotforge.core.errors import OptionsError, UnsupportedModelError

#: Families whose layers the slicing below knows: Llama's projection names, and GPT-2's Conv1D ones.
LLAMA_LIKE = ("llama", "qwen2", "mistral")
GPT2_LIKE = ("gpt2",)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a model splits over ``degree`` ranks: per-rank heads, KV heads, MLP width and vocabulary rows."""

    degree: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @property
    def vocab_shard(self) -> int:
        """Rows of the embedding and head each rank holds (the last rank's padded with zeros)."""
        return -(-self.vocab // self.degree)

    def to_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "vocab_shard": self.vocab_shard}


def layout(model: Any, degree: int, name: str) -> Layout:
    """The split of ``model`` over ``degree`` ranks; a degree that does not divide the heads is refused."""
    family = str(getattr(model.config, "model_type", ""))
    if family not in LLAMA_LIKE + GPT2_LIKE:
        raise UnsupportedModelError(
            f"--tensor-parallel: {name} is a {family or type(model).__name__} model; tensor-parallel builds "
            f"know the layers of {', '.join(LLAMA_LIKE + GPT2_LIKE)}: build it with --tensor-parallel 1"
        )
    config = model.config
    heads = int(getattr(config, "num_attention_heads", 0) or config.n_head)
    kv_heads, head_dim = kv_shape(model)
    mlp = model.base_model.layers[0].mlp if family in LLAMA_LIKE else model.base_model.h[0].mlp
    intermediate = int(mlp.gate_proj.out_features if family in LLAMA_LIKE else mlp.c_fc.nf)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if degree < 1 or kv_heads % degree or heads % degree or intermediate % degree:
        fits = [d for d in range(1, kv_heads + 1) if kv_heads % d == 0 and heads % d == 0 and intermediate % d == 0]
        raise OptionsError(
            f"--tensor-parallel {degree} does not divide {name}'s {kv_heads} key/value heads ({heads} attention "
            f"heads, MLP width {intermediate}): each rank must hold whole key/value-head groups; choose one of "
            f"{', '.join(map(str, fits))}"
        )
    return Layout(degree, heads, kv_heads, head_dim, intermediate, vocab)


class SequenceSplit:
    """The sequence-parallel switch of one rank model, shared by its modules: off, they trace the plain
    tensor-parallel graph (decode, verify); on (:func:`sequence_parallel_prefill`), the split prefill. ``tokens``:
    the prompt's ids the embedding saw, whose length the all-gathers restore."""

    def __init__(self, degree: int, rank: int) -> None:
        self.degree, self.rank = degree, rank
        self.active = False
        self.tokens: torch.Tensor | None = None

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks: this rank's positions of it when active, all of it otherwise."""
        return reduce_scatter(x, self.degree) if self.active else all_reduce(x)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The whole prompt's rows from every rank's slice when active; ``x`` as it is otherwise."""
        if not self.active:
            return x
        if self.tokens is None:
            raise RuntimeError("the sequence-parallel embedding must run before the first all-gather")
        return all_gather(x, self.tokens)


@contextmanager
def sequence_parallel_prefill(model: Any) -> Iterator[None]:
    """Trace ``model`` (a rank model of ``rank_model(..., sequence_parallel=True)``) as the split prefill."""
    split: SequenceSplit = model.sequence_split
    split.active = True
    try:
        yield
    finally:
        split.active, split.tokens = False, None


def rank_model(model: Any, plan: Layout, rank: int, sequence_parallel: bool = False) -> Any:
    """A copy of ``model`` holding rank ``rank``'s slices, its row-parallel outputs all-reduced (reduce-scattered,
    and the norms' outputs all-gathered, in a prefill traced under :func:`sequence_parallel_prefill`)."""
    shard = copy.deepcopy(model)
    split = SequenceSplit(plan.degree, rank)
    _split_vocabulary(shard, plan, rank, split)
    base = shard.base_model
    if model.config.model_type in GPT2_LIKE:
        for block in base.h:
            _split_gpt2_block(block, plan, rank, split)
        norms = [(block, name) for block in base.h for name in ("ln_1", "ln_2")] + [(base, "ln_f")]
        if sequence_parallel:
            base.wpe = SlicedPositions(base.wpe, split)
    else:
        for layer in base.layers:
            _split_llama_layer(layer, plan, rank, split)
        names = ("input_layernorm", "post_attention_layernorm")
        norms = [(layer, name) for layer in base.layers for name in names] + [(base, "norm")]
    if sequence_parallel:
        for owner, name in norms:
            setattr(owner, name, GatheredNorm(getattr(owner, name), split))
        shard.sequence_split = split
    return shard.eval()


class RowParallel(torch.nn.Module):
    """``x @ W_rank`` summed over the ranks (``split.reduce``), then the bias once (a per-rank bias would count
    ``degree`` times). ``weight`` is ``[in_rank, out]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, split: SequenceSplit) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.clone(), requires_grad=False)
        self.split = split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.split.reduce(torch.matmul(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(torch.nn.Module):
    """The embedding rows ``start .. start + len(weight)`` of the vocabulary: a token outside them looks up
    zeros, and the all-reduce (reduce-scatter) sums each token's one real row from the rank that holds it."""

    def __init__(self, weight: torch.Tensor, start: int, split: SequenceSplit) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
        self.start = start
        self.split = split

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        rows = torch.nn.functional.embedding(torch.where(inside, local, 0), self.weight)
        self.split.tokens = input_ids
        return self.split.reduce(torch.where(inside[..., None], rows, 0.0))


class GatheredNorm(torch.nn.Module):
    """A norm over the rank's positions, all-gathered to the whole prompt for the projections that read it."""

    def __init__(self, norm: torch.nn.Module, split: SequenceSplit) -> None:
        super().__init__()
        self.norm, self.split = norm, split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.split.gather(self.norm(x))


class SlicedPositions(torch.nn.Module):
    """GPT-2's replicated position table, looked up for the rank's positions only when the residual stream is
    split (its sum with the reduce-scattered token embeddings is then the rank's slice)."""

    def __init__(self, wpe: torch.nn.Module, split: SequenceSplit) -> None:
        super().__init__()
        self.wpe, self.split = wpe, split

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        rows = self.wpe(position_ids)
        if not self.split.active:
            return rows
        return sequence_slice(rows, self.split.degree, self.split.rank)


def _rows(weight: torch.Tensor, start: int, stop: int, size: int) -> torch.Tensor:
    """Rows ``start .. stop`` of ``weight``, zero-padded to ``size`` rows."""
    part = weight[start:stop].detach().clone()
    if part.shape[0] < size:
        part = torch.cat([part, part.new_zeros(size - part.shape[0], *part.shape[1:])])
    return part


def _split_vocabulary(model: Any, plan: Layout, rank: int, split: SequenceSplit) -> None:
    size = plan.vocab_shard
    start, stop = rank * size, min((rank + 1) * size, plan.vocab)
    embedding = model.get_input_embeddings()
    model.set_input_embeddings(VocabParallelEmbedding(_rows(embedding.weight, start, stop, size), start, split))
    head = model.get_output_embeddings()  # tied or not, the head gets its own slice (equal bytes are stored once)
    head.weight = torch.nn.Parameter(_rows(head.weight, start, stop, size), requires_grad=False)
    if head.bias is not None:
        head.bias = torch.nn.Parameter(_rows(head.bias, start, stop, size), requires_grad=False)
    head.out_features = size


def _column(linear: torch.nn.Linear, start: int, stop: int) -> None:
    """Output features ``start .. stop`` of an ``nn.Linear`` (weight ``[out, in]``)."""
    linear.weight = torch.nn.Parameter(linear.weight[start:stop].detach().clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = torch.nn.Parameter(linear.bias[start:stop].detach().clone(), requires_grad=False)
    linear.out_features = stop - start


def _split_llama_layer(layer: Any, plan: Layout, rank: int, split: SequenceSplit) -> None:
    attn, mlp, hd = layer.self_attn, layer.mlp, plan.head_dim
    q = plan.heads // plan.degree * hd
    kv = plan.kv_heads // plan.degree * hd
    _column(attn.q_proj, rank * q, (rank + 1) * q)
    _column(attn.k_proj, rank * kv, (rank + 1) * kv)
    _column(attn.v_proj, rank * kv, (rank + 1) * kv)
    o = attn.o_proj
    attn.o_proj = RowParallel(o.weight[:, rank * q : (rank + 1) * q].T, o.bias, split)
    width = plan.intermediate // plan.degree
    _column(mlp.gate_proj, rank * width, (rank + 1) * width)
    _column(mlp.up_proj, rank * width, (rank + 1) * width)
    down = mlp.down_proj
    mlp.down_proj = RowParallel(down.weight[:, rank * width : (rank + 1) * width].T, down.bias, split)


def _split_gpt2_block(block: Any, plan: Layout, rank: int, split: SequenceSplit) -> None:
    """GPT-2's Conv1D keeps its weight ``[in, out]``: column-parallel slices columns, row-parallel rows."""
    attn, mlp = block.attn, block.mlp
    hidden = attn.embed_dim
    part = hidden // plan.degree
    cols = torch.cat([torch.arange(p * hidden + rank * part, p * hidden + (rank + 1) * part) for p in range(3)])
    attn.c_attn.weight = torch.nn.Parameter(attn.c_attn.weight[:, cols].detach().clone(), requires_grad=False)
    attn.c_attn.bias = torch.nn.Parameter(attn.c_attn.bias[cols].detach().clone(), requires_grad=False)
    attn.c_attn.nf = 3 * part
    attn.split_size = part
    attn.c_proj = RowParallel(attn.c_proj.weight[rank * part : (rank + 1) * part], attn.c_proj.bias, split)
    width = plan.intermediate // plan.degree
    fc = mlp.c_fc
    fc.weight = torch.nn.Parameter(
        fc.weight[:, rank * width : (rank + 1) * width].detach().clone(), requires_grad=False
    )
    fc.bias = torch.nn.Parameter(fc.bias[rank * width : (rank + 1) * width].detach().clone(), requires_grad=False)
    fc.nf = width
    mlp.c_proj = RowParallel(mlp.c_proj.weight[rank * width : (rank + 1) * width], mlp.c_proj.bias, split)
