"""The targets' weight-only rounding as a differentiable forward: what quantization-aware training trains through.

Each weight a target packs is replaced, in the forward pass, by the value the target will compute with: rounded on
that target's grid (``Target.weight_grids``), the gradient passed through the rounding unchanged (the straight-through
estimator, ``w + (q(w) - w).detach()``). The grids are the targets' own rules, not an approximation of them
(``tests/test_qat.py`` checks each against ONNX Runtime's ``quantize_matmul_{4,8}bits`` and tvm's packing):

- int4: symmetric blocks along K, the value of largest magnitude mapped to ``-8`` (step ``max|w| / 8``); tvm stores
  the scale as float16 and rounds halfway values to even, ONNX Runtime keeps float32 and rounds as MLAS does;
- int8: ONNX Runtime's MatMulNBits the same in blocks (``-128``), tvm's kernel one scale per output channel
  (``max|w| / 127``).

They hang on the modules as ``torch.nn.utils.parametrize`` parametrizations, so the model trains, saves and is
scored as usual; :func:`remove_fake_quant` leaves the float weights the target will round.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.nn.utils import parametrize

from aotforge.compiler.generative.calibrate import Linear, layer_linears
from aotforge.compiler.training.options import Placement
from aotforge.targets import get_target


@dataclasses.dataclass(frozen=True)
class Grid:
    """One target's rounding of a ``[N, K]`` weight at some bits."""

    #: The value of largest magnitude maps to ``-levels`` (symmetric blocks) or to ``levels`` (per channel).
    levels: int
    #: Values along K sharing a scale; 0: one scale per output channel.
    block: int
    #: tvm: the scale as stored, in float16; values halfway between levels round to even.
    float16_scales: bool = False
    #: ONNX Runtime (MLAS): ``roundf(w * (1 / scale) + zero_point)``, halfway rounding away from the zero point.
    mlas: bool = False

    def __call__(self, w_nk: torch.Tensor) -> torch.Tensor:
        """``w_nk`` rounded to this grid and dequantized (float32).

        The same operations in the same order as the targets' rules, written in place on two temporaries: the
        rounding runs over every packed weight at every training step, where fresh full-size tensors cost more
        than the arithmetic."""
        n, k = w_nk.shape
        w = w_nk.float()
        if self.block == 0:
            amax = w.abs().amax(dim=1, keepdim=True)
            scale = torch.where(amax > 0, amax / self.levels, torch.ones_like(amax))
            return torch.round(w / scale).clamp_(-self.levels, self.levels).mul_(scale)
        pad = -k % self.block  # both targets pad K to whole blocks with zeros
        padded = torch.nn.functional.pad(w, (0, pad)) if pad else w
        blocks = padded.reshape(n, (k + pad) // self.block, self.block)
        scale = _extreme(blocks, self.mlas) / -float(self.levels)
        if self.float16_scales:
            scale = scale.half().float()
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        if self.mlas:
            shifted = (blocks * (1.0 / scale)).add_(self.levels)
            q = torch.trunc(shifted)
            q.add_(shifted.sub_(q).ge_(0.5)).sub_(self.levels)  # ``shifted`` becomes its fraction, then the carry
        else:
            q = torch.round(blocks / scale)
        return q.clamp_(-self.levels, self.levels - 1).mul_(scale).reshape(n, k + pad)[:, :k]


def _extreme(blocks: torch.Tensor, mlas: bool) -> torch.Tensor:
    """Each block's value of largest magnitude where ``a`` and ``-a`` tie: MLAS keeps ``-a``, tvm's ``argmax |w|``
    the first of them. From two cheap reductions: an arg-max over short blocks is the rounding's costliest step."""
    hi, lo = blocks.amax(dim=2, keepdim=True), blocks.amin(dim=2, keepdim=True)
    if mlas:
        return torch.where(hi > -lo, hi, lo)
    extreme = torch.where(hi >= -lo, hi, lo)
    ties = ((hi == -lo) & (hi != 0)).squeeze(2).nonzero(as_tuple=True)
    if len(ties[0]):
        tied = blocks[ties]
        extreme[ties] = torch.gather(tied, 1, tied.abs().argmax(dim=1, keepdim=True))
    return extreme


def grid(target: str, bits: int, block: int) -> Grid:
    """``target``'s rounding at ``bits`` in blocks of ``block`` (both checked by :class:`Placement`)."""
    rule = get_target(target).weight_grids[bits]
    return Grid(rule.levels, block if rule.blocked else 0, float16_scales=rule.float16_scales, mlas=rule.mlas)


class FakeQuant(torch.nn.Module):
    """A parametrization: the weight as the target rounds it, the gradient straight through (GPT-2's ``[K, N]``
    Conv1D weights transposed around the rounding)."""

    def __init__(self, rounding: Grid, transposed: bool) -> None:
        super().__init__()
        self.rounding, self.transposed = rounding, transposed

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        w_nk = w.t() if self.transposed else w
        q = self.rounding(w_nk.detach()).to(w.dtype)
        return _StraightThrough.apply(w, q.t() if self.transposed else q)


class _StraightThrough(torch.autograd.Function):
    """``q`` forward, the gradient to ``w`` unchanged backward: the straight-through estimator without the two
    full-size temporaries of ``w + (q - w).detach()`` (whose forward is not even ``q`` bit for bit)."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return q

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def add_fake_quant(model: Any, where: Placement) -> dict[str, int]:
    """Parametrize ``model``'s packed weights with their target's rounding; the bits of each, by name."""
    chosen: dict[str, int] = {}
    for i, layer in enumerate(layer_linears(model)):
        for lin in layer:
            bits = 8 if i in where.layers_8bit else where.bits
            rounding = FakeQuant(grid(where.target, bits, where.block_size), lin.conv1d)
            parametrize.register_parametrization(lin.module, "weight", rounding)
            chosen[lin.name] = bits
    head = model.get_output_embeddings()
    if head is not None:
        lin = Linear("lm_head", head)
        bits = where.head_bits or where.bits
        # A tied head: the parametrization holds the shared tensor, the embedding lookup keeps reading it in float.
        rounding = FakeQuant(grid(where.target, bits, where.block_size), lin.conv1d)
        parametrize.register_parametrization(head, "weight", rounding)
        chosen[lin.name] = bits
    return chosen


def remove_fake_quant(model: Any) -> None:
    """Every parametrization off, each module keeping its float (trained) weight."""
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
