"""Calibrated int4 weights for a decoder, computed on the fp32 torch model before the export.

Each target quantizes its graph's float weights itself, round-to-nearest in symmetric blocks
(``targets/tvm/kernels/weight_only.quantize_int4`` is that rounding: ONNX Runtime's MatMulNBits
rule, the step ``max|w| / 8`` with float16 scales). The methods here change the float weights so
that this rounding, on either target, gives a better model; what the targets compile is untouched:

- ``awq`` (activation-aware scaling, Lin et al. 2023): input channels that carry large activations
  are scaled up in the weight before rounding and the inverse scale is folded into the operation
  that produces them (the RMSNorm / LayerNorm weight, or ``up_proj``'s rows ahead of ``down_proj``).
  The float model computes the same function; the exponent of the scale is searched per group of
  matmuls on the calibration text. Then each block's clipping ratio is searched the same way: a
  clipped block's largest value sets the target's step, so the clipping survives the rounding.
- ``gptq`` (Frantar et al. 2022): columns are rounded one at a time and the error of each is
  spread over the columns not yet rounded, weighted by the calibration inputs' second moments.
  ONNX Runtime's GPTQ (Intel Neural Compressor's) rounds to a grid (step ``2 max / 15``, zero 8)
  that neither MatMulNBits' symmetric rounding nor the tvm kernel reproduces, so the update runs
  here on the targets' own grid; the weights it writes are grid values ``q * step`` whose block
  keeps its ``-8`` level, which the targets' rounding maps back to the same ``q`` and step.

Calibration text: the tokens of the quality gate's text past the ones it scores (``quality.py``), so
the gate's perplexity stays held out. The LM head is left to the target (its ``head_bits``): tied to
the embedding, a change to it would change the token lookups too.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

#: What a calibration run reads: windows of this many tokens, at most this many of them.
CALIBRATION_WINDOW = 512
CALIBRATION_WINDOWS = 4
#: AWQ's search grid: exponents of the mean activation magnitude, clipping ratios of a block's max.
AWQ_EXPONENTS = tuple(i / 5 for i in range(6))
CLIP_RATIOS = tuple(1 - i / 40 for i in range(9))
#: GPTQ's dampening of the Hessian's diagonal (its authors' default) and its column block.
GPTQ_DAMP = 0.01
GPTQ_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class Linear:
    """One matmul of a decoder layer as calibration sees it: the module, and the weight as ``[N, K]``."""

    name: str
    module: Any

    @property
    def conv1d(self) -> bool:  # GPT-2's Conv1D stores its weight as [K, N]
        return type(self.module).__name__ == "Conv1D"

    def weight(self) -> Any:
        w = self.module.weight.data
        return w.t() if self.conv1d else w

    def set_weight(self, w_nk: Any) -> None:
        self.module.weight.data.copy_(w_nk.t() if self.conv1d else w_nk)


@dataclasses.dataclass(frozen=True)
class ScaleGroup:
    """Matmuls that read one activation, and how to fold an inverse scale of its channels into its producer."""

    linears: tuple[Linear, ...]
    #: ``fold(inverse_scale)`` divides the producer's output channels by the scale (a norm's weight and bias,
    #: or a matmul's output rows).
    fold: Any


def layer_groups(model: Any) -> list[list[ScaleGroup]]:
    """Per decoder layer, the groups AWQ can scale (Llama / Qwen2 / GPT-2 layouts; others: none)."""

    def norm_fold(norm: Any) -> Any:
        def fold(inv: Any) -> None:
            norm.weight.data.mul_(inv)
            if getattr(norm, "bias", None) is not None:
                norm.bias.data.mul_(inv)

        return fold

    def rows_fold(lin: Linear) -> Any:
        def fold(inv: Any) -> None:
            lin.set_weight(lin.weight() * inv[:, None])
            if getattr(lin.module, "bias", None) is not None:
                lin.module.bias.data.mul_(inv)

        return fold

    groups: list[list[ScaleGroup]] = []
    for i, layer in enumerate(_layers(model)):
        p = f"layer {i}"
        if hasattr(layer, "self_attn") and hasattr(layer, "mlp") and hasattr(layer.mlp, "gate_proj"):
            attn, mlp = layer.self_attn, layer.mlp
            up = Linear(f"{p} mlp.up_proj", mlp.up_proj)
            groups.append(
                [
                    ScaleGroup(
                        tuple(Linear(f"{p} self_attn.{n}", getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj")),
                        norm_fold(layer.input_layernorm),
                    ),
                    ScaleGroup(
                        (Linear(f"{p} mlp.gate_proj", mlp.gate_proj), up), norm_fold(layer.post_attention_layernorm)
                    ),
                    ScaleGroup((Linear(f"{p} mlp.down_proj", mlp.down_proj),), rows_fold(up)),
                ]
            )
        elif hasattr(layer, "attn") and hasattr(layer, "ln_1"):  # GPT-2
            groups.append(
                [
                    ScaleGroup((Linear(f"{p} attn.c_attn", layer.attn.c_attn),), norm_fold(layer.ln_1)),
                    ScaleGroup((Linear(f"{p} mlp.c_fc", layer.mlp.c_fc),), norm_fold(layer.ln_2)),
                ]
            )
        else:
            groups.append([])
    return groups


def layer_linears(model: Any) -> list[list[Linear]]:
    """Per decoder layer, every matmul with a weight (nn.Linear, GPT-2's Conv1D), in module order."""
    out = []
    for i, layer in enumerate(_layers(model)):
        found = [
            Linear(f"layer {i} {n}", m)
            for n, m in layer.named_modules()
            if type(m).__name__ in ("Linear", "Conv1D") and getattr(m, "weight", None) is not None
        ]
        out.append(found)
    return out


def _layers(model: Any) -> list[Any]:
    base = model.base_model
    for attr in ("layers", "h"):
        if hasattr(base, attr):
            return list(getattr(base, attr))
    return []


def calibration_windows(tokens: np.ndarray, model: Any = None) -> list[np.ndarray]:
    """Up to :data:`CALIBRATION_WINDOWS` windows of :data:`CALIBRATION_WINDOW` tokens (a shorter last one), or of
    the positions ``model`` has when it has fewer (GPT-2's learned positions)."""
    config = getattr(model, "config", None)
    limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    window = min(CALIBRATION_WINDOW, int(limit or CALIBRATION_WINDOW))
    starts = range(0, len(tokens) - 1, window)
    return [tokens[s : s + window] for s in starts][:CALIBRATION_WINDOWS]


def input_hessians(model: Any, linears: list[Linear], windows: list[np.ndarray]) -> dict[str, Any]:
    """``X^T X`` of each matmul's input over the calibration windows (``[K, K]``), by name; matmuls that read
    one tensor (Q, K and V) share its product."""
    import torch

    hessians: dict[str, Any] = {}
    hooks = []
    last: dict[str, Any] = {}  # the input tensor last seen and its product, for siblings reading the same one
    for lin in linears:

        def hook(module: Any, args: tuple[Any, ...], _out: Any, name: str = lin.name) -> None:
            if last.get("x") is not args[0]:
                x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
                last.update(x=args[0], h=x.t() @ x)
            hessians[name] = hessians.get(name, 0) + last["h"]

        hooks.append(lin.module.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            for w in windows:
                model(input_ids=torch.from_numpy(np.asarray(w, dtype=np.int64))[None])
                last.clear()
    finally:
        for h in hooks:
            h.remove()
    return hessians


def rtn_int4(w_nk: Any, group: int) -> Any:
    """The targets' symmetric int4 rounding of a ``[N, K]`` weight, dequantized (torch; K a multiple of ``group``)."""
    import torch

    n, k = w_nk.shape
    blocks = w_nk.float().reshape(n, k // group, group)
    extreme = torch.gather(blocks, 2, blocks.abs().argmax(dim=2, keepdim=True))
    scale = (extreme / -8.0).half().float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (torch.clamp(torch.round(blocks / scale), -8, 7) * scale).reshape(n, k)


def _quantizable(lin: Linear, group: int) -> bool:
    return int(lin.weight().shape[1]) % group == 0


def awq(model: Any, windows: list[np.ndarray], group: int) -> dict[str, Any]:
    """Scale each group's input channels (searched exponent), then search each block's clipping ratio; in place."""
    import torch

    report: dict[str, Any] = {"scaled": {}, "clipped_blocks": 0, "blocks": 0}
    groups = [g for layer in layer_groups(model) for g in layer]
    first = {g.linears[0].name: g for g in groups}
    hessians = input_hessians(model, [g.linears[0] for g in groups], windows)
    for name, g in first.items():
        if not all(_quantizable(lin, group) for lin in g.linears):
            continue
        h = hessians[name].float()
        x_mag = torch.sqrt(torch.clamp(torch.diagonal(h), min=1e-12))  # per-channel activation magnitude (rms)
        weights = [lin.weight().float() for lin in g.linears]
        best, best_err = 0.0, None
        for alpha in AWQ_EXPONENTS:
            s = x_mag**alpha
            s = s / torch.sqrt(s.max() * s.min())
            err = sum(_output_error(w, rtn_int4(w * s, group) / s, h) for w in weights)
            if best_err is None or err < best_err:
                best, best_err = alpha, err
        s = x_mag**best
        s = s / torch.sqrt(s.max() * s.min())
        if best > 0:
            g.fold(1.0 / s)
            for lin, w in zip(g.linears, weights, strict=True):
                lin.set_weight(w * s)
        report["scaled"][name] = best
    # Clipping on the scaled model's own activations: a second pass, every matmul of the layers.
    linears = [lin for layer in layer_linears(model) for lin in layer if _quantizable(lin, group)]
    hessians = input_hessians(model, linears, windows)
    for lin in linears:
        w, clipped = clip_blocks(lin.weight().float(), hessians[lin.name].float(), group)
        lin.set_weight(w)
        report["clipped_blocks"] += clipped
        report["blocks"] += w.numel() // group
    del torch
    return report


def _output_error(w: Any, wq: Any, h: Any) -> float:
    """``sum ||X (w - wq)^T||^2`` from the input's ``X^T X``."""
    d = (w - wq).float()
    return float(((d @ h) * d).sum())


def clip_blocks(w_nk: Any, h: Any, group: int) -> tuple[Any, int]:
    """Each block clipped to the ratio of its max (:data:`CLIP_RATIOS`) whose rounding errs least on the
    calibration inputs (the block's own ``32 x 32`` part of ``X^T X``); the weight and how many were clipped."""
    import torch

    n, k = w_nk.shape
    blocks = w_nk.reshape(n, k // group, group)
    hb = torch.stack([h[j : j + group, j : j + group] for j in range(0, k, group)])  # [G, g, g]
    amax = blocks.abs().amax(dim=2, keepdim=True)
    best_err = torch.full((n, k // group), float("inf"))
    best = blocks.clone()
    for ratio in CLIP_RATIOS:
        clipped = torch.clamp(blocks, -amax * ratio, amax * ratio)
        q = rtn_int4(clipped.reshape(n, k), group).reshape(n, k // group, group)
        d = blocks - q
        err = (torch.bmm(d.transpose(0, 1), hb).transpose(0, 1) * d).sum(dim=2)  # d^T H d per block
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better[:, :, None], clipped, best)
    changed = int((best != blocks).any(dim=2).sum())
    return best.reshape(n, k), changed


def gptq(model: Any, windows: list[np.ndarray], group: int) -> dict[str, Any]:
    """Every layer matmul's weight replaced by its GPTQ rounding on the targets' grid; in place."""
    linears = [lin for layer in layer_linears(model) for lin in layer if _quantizable(lin, group)]
    hessians = input_hessians(model, linears, windows)
    for lin in linears:
        lin.set_weight(gptq_int4(lin.weight().float(), hessians[lin.name].float(), group))
    return {"weights": len(linears)}


def gptq_int4(w_nk: Any, h: Any, group: int) -> Any:
    """GPTQ of one ``[N, K]`` weight: grid values whose blocks each keep the ``-8`` level of their step."""
    import torch

    w = w_nk.clone().float()
    n, k = w.shape
    h = h.clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += torch.eye(k) * GPTQ_DAMP * torch.diagonal(h).mean()
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q_all = torch.zeros_like(w)
    scale = pin = torch.zeros(n)
    step = max(GPTQ_BLOCK, group)  # a whole number of blocks per step
    for i1 in range(0, k, step):
        i2 = min(i1 + step, k)
        w1, err1 = w[:, i1:i2].clone(), torch.zeros(n, i2 - i1)
        for i in range(i2 - i1):
            col = i1 + i
            if col % group == 0:
                # The step of the block from its current values, as the targets' rounding derives it, and the
                # column of the value that sets it: that value is rounded to -8 so the step survives re-rounding.
                block = w1[:, i : i + group]
                arg = block.abs().argmax(dim=1)
                extreme = block.gather(1, arg[:, None])[:, 0]
                scale = (extreme / -8.0).half().float()
                scale = torch.where(scale == 0, torch.ones_like(scale), scale)
                pin = arg + col
            q = torch.clamp(torch.round(w1[:, i] / scale), -8, 7)
            q = torch.where(pin == col, torch.full_like(q, -8.0), q) * scale
            q_all[:, col] = q
            e = (w1[:, i] - q) / hinv[col, col]
            w1[:, i:] -= e[:, None] * hinv[col, col:i2][None, :]
            err1[:, i] = e
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    return q_all


def calibrated_copy(model: Any, method: str, tokens: np.ndarray, group: int) -> tuple[Any, dict[str, Any]]:
    """A copy of ``model`` with its layer weights calibrated by ``method`` (``awq``, ``gptq``, ``awq+gptq``)."""
    windows = calibration_windows(tokens, model)
    out = copy.deepcopy(model)
    report: dict[str, Any] = {"method": method, "calibration_tokens": int(sum(len(w) for w in windows))}
    for step in method.split("+"):
        report[step] = {"awq": awq, "gptq": gptq}[step](out, windows, group)
    return out, report
