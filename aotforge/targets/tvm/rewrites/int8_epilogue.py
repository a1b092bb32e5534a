"""Relax rule: an integer convolution's bias / clip / requantize chain -> the kernel's write-back (tvm target).

After ``int8_conv``, each QDQ convolution of a static ``int8`` CNN is an int32 kernel followed,
channels-last, by ``astype(float32) * scale + bias``, an optional clip (ReLU / ReLU6: maximum,
minimum, clip, relu), and the next convolution's ``quantize`` to 8 bits. Fused by Relax, that
chain is a kernel of its own per convolution: a launch, and the int32 tile written and read
back, for a few microseconds of arithmetic. This rule folds any such chain of per-channel
constants into one affine map and a clamp per output channel (``kernels.requantize``) and
rebuilds the convolution kernel with it in its write-back, so the kernel writes the 8-bit
activation the next one reads. Each value of the chain must have no other reader (else it is
left as it is, with the reason); the chain may be in any order (a bias after the clip, a
negative scale) since each step is applied to the map and its bounds exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aotforge.targets.tvm.kernels import requantize
from aotforge.targets.tvm.relax_util import constant_value, op_name, relax_functions, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule

_AFFINE = frozenset({"relax.multiply", "relax.add", "relax.subtract", "relax.divide"})
_BOUNDS = frozenset({"relax.maximum", "relax.minimum"})


class KernelBuilders:
    """Integer convolution kernels by name -> a builder of the same kernel writing an 8-bit type
    through a requantizing write-back (filled by the ``int8_conv`` rules as they add kernels)."""

    def __init__(self) -> None:
        self._builders: dict[str, Callable[[str], Any]] = {}
        self._lanes: dict[str, np.ndarray] = {}

    def register(self, name: str, build: Callable[[str], Any], lanes: np.ndarray | None = None) -> None:
        """``lanes``: the channel of each position of the kernel's per-channel constants, where they
        are not in channel order (the requantize table is then laid out the same way)."""
        self._builders[name] = build
        if lanes is not None:
            self._lanes[name] = lanes

    def get(self, name: str) -> Callable[[str], Any] | None:
        return self._builders.get(name)

    def table(self, name: str, table: np.ndarray) -> np.ndarray:
        """``table`` (``f32[ROWS, C]``) in kernel ``name``'s order of positions."""
        lanes = self._lanes.get(name)
        return table if lanes is None else np.ascontiguousarray(table[:, lanes])


@dataclass
class _Map:
    """``clamp(acc * scale + shift, low, high)`` per output channel, in float64 while folding."""

    scale: np.ndarray
    shift: np.ndarray
    low: np.ndarray = field(init=False)
    high: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.low, self.high = np.full_like(self.scale, -np.inf), np.full_like(self.scale, np.inf)

    def multiply(self, m: np.ndarray) -> None:
        self.scale, self.shift = self.scale * m, self.shift * m
        low, high = self.low * m, self.high * m
        self.low, self.high = np.where(m < 0, high, low), np.where(m < 0, low, high)

    def add(self, c: np.ndarray) -> None:
        self.shift, self.low, self.high = self.shift + c, self.low + c, self.high + c

    def clamp(self, low: np.ndarray | float = -np.inf, high: np.ndarray | float = np.inf) -> None:
        """``min(max(v, low), high)`` of the clamped value: both bounds move (max then min)."""
        self.low, self.high = np.minimum(np.maximum(self.low, low), high), np.minimum(np.maximum(self.high, low), high)


def _constant(expr: Any, bound: Callable[[Any], Any]) -> np.ndarray | None:
    """``expr``'s value where it is a constant, or a dequantize / reshape / transpose / cast of one
    (how the importer leaves a quantized bias), computed in numpy; else ``None``."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        value = bound(expr)
        return None if value is None or value.same_as(expr) else _constant(value, bound)
    value = constant_value(expr)
    if value is not None:
        return value
    name = op_name(expr)
    if name in ("relax.isnan", "relax.where"):  # the ONNX importer's Clip bound: where(isnan(b), -inf, b)
        args = [_constant(a, bound) for a in expr.args]
        if any(a is None for a in args):
            return None
        if name == "relax.isnan":
            return np.isnan(args[0])  # type: ignore[arg-type]
        condition, yes, no = args
        return np.asarray(np.where(condition, yes, no))  # type: ignore[arg-type]
    if name not in ("relax.dequantize", "relax.reshape", "relax.permute_dims", "relax.astype"):
        return None
    inputs = [_constant(a, bound) for a in expr.args[: 3 if name == "relax.dequantize" else 1]]
    shape = static_shape(expr)
    if any(v is None for v in inputs) or shape is None:
        return None
    x = inputs[0].astype(np.float64)  # type: ignore[union-attr]
    if name == "relax.dequantize":
        axis, (scale, zero) = int(expr.attrs.axis) % max(x.ndim, 1), inputs[1:]
        along = [-1 if d == axis else 1 for d in range(x.ndim)] if x.ndim else []
        x = (x - zero.reshape(along)) * scale.reshape(along)  # type: ignore[union-attr]
    elif name == "relax.permute_dims":
        x = x.transpose([int(a) for a in expr.attrs.axes] if expr.attrs.axes is not None else None)
    return x.reshape(shape)


def _per_channel(value: np.ndarray | None, channels: int) -> np.ndarray | None:
    """A constant that varies at most along the last (channel) axis, as ``[channels]``; else ``None``."""
    if value is None or value.ndim > 4 or any(d != 1 for d in value.shape[:-1]):
        return None
    if value.size not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,)).copy()


@dataclass(frozen=True)
class _Chain:
    kernel: Any  # the int32 kernel's call_tir
    steps: list[Any]  # the calls from the cast (excluded) to the quantize's input, in order
    vars: list[Any]  # every value between the kernel and the quantize (each must have one reader)


def _chain(call: Any, bound: Callable[[Any], Any], builders: KernelBuilders) -> _Chain | None:
    """The ops from a registered kernel's int32 result to ``call`` (a quantize), or ``None``."""
    from tvm import relax

    steps: list[Any] = []
    vars_, x = [], call.args[0]
    while isinstance(x, relax.Var):
        value, name = bound(x), op_name(bound(x))
        vars_.append(x)
        if name == "relax.astype" and str(value.attrs.dtype) == "float32":
            producer = bound(value.args[0])
            if op_name(producer) != "relax.call_tir" or builders.get(producer.args[0].name_hint) is None:
                return None
            return _Chain(producer, steps[::-1], [*vars_, value.args[0]])
        if name not in _AFFINE | _BOUNDS | {"relax.clip", "relax.nn.relu"}:
            return None
        steps.append(value)
        operands = [a for a in value.args if isinstance(a, relax.Var) and _constant(a, bound) is None]
        if len(operands) != 1:
            return None
        x = operands[0]
    return None


def _fold(chain: _Chain, quantize: Any, bound: Callable[[Any], Any], channels: int) -> _Map | str:
    """The chain and ``quantize`` as one per-channel map, or why they are not one."""
    from tvm import relax

    from aotforge.targets.tvm.rewrites.clip import _number

    fold = _Map(np.ones(channels), np.zeros(channels))
    for step in chain.steps:
        name = op_name(step)
        if name == "relax.nn.relu":
            fold.clamp(low=0.0)
            continue
        if name == "relax.clip":
            fold.clamp(_number(step.args[1]), _number(step.args[2]))
            continue
        var_first = isinstance(step.args[0], relax.Var) and _constant(step.args[0], bound) is None
        const = _per_channel(_constant(step.args[1 if var_first else 0], bound), channels)
        if const is None:
            return "a constant of the chain varies along more than the channels"
        if name == "relax.maximum":
            fold.clamp(low=const)
        elif name == "relax.minimum":
            fold.clamp(high=const)
        elif name == "relax.add":
            fold.add(const)
        elif name == "relax.multiply":
            fold.multiply(const)
        elif name == "relax.subtract" and var_first:
            fold.add(-const)
        elif name == "relax.subtract":  # const - x
            fold.multiply(-np.ones(channels))
            fold.add(const)
        elif not var_first or np.any(const == 0):  # divide
            return "a division by the activation or by zero"
        else:
            fold.multiply(1 / const)
    scale, zero = (_per_channel(_constant(a, bound), channels) for a in quantize.args[1:3])
    if scale is None or zero is None or np.any(scale == 0):
        return "the quantize's scale or zero point is not a per-channel constant"
    fold.multiply(1 / scale)
    fold.shift = fold.shift + zero
    fold.low, fold.high = np.round(fold.low) + zero, np.round(fold.high) + zero
    return fold


class RequantizeInKernel(Rule):
    """``quantize(chain(astype(kernel(...), float32)))`` -> the kernel with a requantizing write-back."""

    name = "requantize_epilogue"

    def __init__(self, builders: KernelBuilders, readers: dict[Any, int]) -> None:
        self.builders, self.readers = builders, readers

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return (
            op_name(call) == "relax.quantize"
            and str(call.attrs.out_dtype) in requantize.RANGES
            and _chain(call, bound, self.builders) is not None
        )

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        chain = _chain(call, rw.bound, self.builders)
        assert chain is not None  # ``matches`` checked it
        shape = static_shape(chain.kernel)
        if shape is None or str(chain.kernel.ty.dtype) != "int32" or static_shape(call) != shape:
            return MatchResult.fail("the requantized value is not the kernel's int32 result's shape")
        if int(call.attrs.axis) % len(shape) != len(shape) - 1:
            return MatchResult.fail("the quantize's axis is not the channels")
        if any(self.readers.get(v, 0) != 1 for v in chain.vars):
            return MatchResult.fail("a value between the convolution and its requantize has another reader")
        fold = _fold(chain, call, rw.bound, shape[-1])
        if isinstance(fold, str):
            return MatchResult.fail(fold)
        out_dtype = str(call.attrs.out_dtype)
        return MatchResult((chain.kernel, requantize.table(fold.scale, fold.shift, fold.low, fold.high, out_dtype)))

    def rewrite(self, call: Any, value: tuple[Any, np.ndarray], rw: Rewriter) -> Any:
        from tvm import relax

        kernel, table = value
        name, out_dtype = kernel.args[0].name_hint, str(call.attrs.out_dtype)
        build = self.builders.get(name)
        assert build is not None  # ``matches`` checked it
        gv = rw.add_kernel(f"{name}_{out_dtype}", lambda: build(out_dtype))
        args = [*kernel.args[1].fields, relax.const(self.builders.table(name, table))]
        return relax.call_tir(gv, args, relax.TensorType(static_shape(kernel), out_dtype))


def readers(mod: Any) -> dict[Any, int]:
    """How many bindings (and function results) of ``mod``'s Relax functions read each var."""
    from tvm import relax

    counts: dict[Any, int] = {}

    def count(expr: Any) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1
        elif isinstance(expr, relax.Call):
            for arg in expr.args:
                count(arg)
        elif isinstance(expr, relax.Tuple):
            for item in expr.fields:
                count(item)
        elif isinstance(expr, relax.TupleGetItem):
            count(expr.tuple_value)

    for _, func in relax_functions(mod):
        for block in func.body.blocks:
            for binding in block.bindings:
                count(binding.value)
        count(func.body.body)
    return counts
