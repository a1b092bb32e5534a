"""QDQ convolutions (static ``int8``) on integer kernels (tvm target).

The importer keeps ``conv2d(dequantize(q_u8, s, z), dequantize(w_s8, sw, 0))``: a float
convolution on values that are integers underneath. Here it is computed in integers, as ONNX
Runtime's QLinearConv does: the uint8 activation goes channels-last and padded with the zero
point ``z`` (which dequantizes to 0) in one pass (``kernels.nhwc_input``, or ``kernels.nhwc_stem``
for a 3-channel image), a kernel convolves it with the constant weight (``kernels.vnni_conv`` for
plain convolutions, ``kernels.vnni_depthwise`` for depthwise ones, ``kernels.int8_depthwise`` where
that one cannot take the shape), and the int32 result is scaled back to float by
``s * sw`` per output channel. That result is NHWC; its NCHW form is bound as a transpose of it
(``channels_last.Twins``), so an activation another integer kernel reads next stays NHWC, and an
unpadded one is read in place. Channels of a plain convolution are padded to a multiple of 4
with zero weights, so 3-channel stems qualify.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aotforge.targets.tvm.kernels import (
    int8_depthwise,
    nhwc_input,
    nhwc_stem,
    vnni_conv,
    vnni_dense,
    vnni_depthwise,
)
from aotforge.targets.tvm.relax_util import constant_value, op_name, static_shape
from aotforge.targets.tvm.rewrites.channels_last import Twins
from aotforge.targets.tvm.rewrites.int8_epilogue import KernelBuilders
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule


@dataclass(frozen=True)
class ConvShape:
    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    groups: int = 1

    @property
    def out_hw(self) -> tuple[int, int]:
        hp, wp = self.padded_hw
        return (hp - self.kh) // self.strides[0] + 1, (wp - self.kw) // self.strides[1] + 1

    @property
    def channels(self) -> int:
        """``C`` padded to the VNNI kernel's group of 4 (zero weights): a 3-channel stem reads 4."""
        return self.c if self.groups > 1 else -(-self.c // vnni_dense.GROUP) * vnni_dense.GROUP

    @property
    def padded_hw(self) -> tuple[int, int]:
        top, left, bottom, right = self.padding
        return self.h + top + bottom, self.w + left + right

    @property
    def needs_copy(self) -> bool:
        """Whether the kernel's input differs from the channels-last activation (padding of either kind)."""
        return any(self.padding) or self.channels != self.c


def conv_shape(call: Any, x_shape: list[int], w_shape: list[int]) -> ConvShape | str:
    """The shape of a plain NCHW/OIHW ``relax.nn.conv2d`` call, or why no integer kernel can take it."""
    attrs = call.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW" or str(attrs.out_layout) != "NCHW":
        return "convolution is not NCHW/OIHW"
    if any(int(d) != 1 for d in attrs.dilation):
        return "dilated convolution"
    n, c, h, w = x_shape
    o, _, kh, kw = w_shape
    top, left, bottom, right = (int(p) for p in attrs.padding)
    strides = (int(attrs.strides[0]), int(attrs.strides[1]))
    shape = ConvShape(n, c, h, w, o, kh, kw, strides, (top, left, bottom, right), int(attrs.groups))
    if shape.groups == 1 and o % vnni_dense.LANES:
        return f"{o} output channels are not a multiple of {vnni_dense.LANES}"
    if shape.groups > 1 and shape.groups != c:
        return f"grouped convolution with {c // shape.groups} channels per group (only depthwise is supported)"
    return (int8_depthwise.supports(c, o, kh, kw) or shape) if shape.groups > 1 else shape


def _equals_constant(expr: Any, value: np.ndarray) -> bool:
    constant = constant_value(expr)
    return constant is not None and np.array_equal(constant, value)


def _from_nchw(match: ConvMatch, zero_point: Any, rw: Rewriter) -> Any:
    """``match.q`` (NCHW) as the kernel's padded NHWC input, quantized on the way from the float
    ``x`` of ``q = quantize(x)`` with the same scalar scale and zero point, else copied."""
    from tvm import relax

    shape, q = match.shape, match.q
    producer = rw.bound(q)
    quantize = (
        op_name(producer) == "relax.quantize"
        and str(producer.args[0].ty.dtype) == "float32"
        and _equals_constant(producer.args[1], match.scale)
        and _equals_constant(producer.args[2], match.zero)
    )
    dims = (shape.n, shape.c, shape.h, shape.w)
    key = "x".join(str(v) for v in (*dims, *shape.padding, shape.channels))
    vectorized = nhwc_stem.supports(dims, shape.channels)  # a 3-channel image: runs of 16 pixels
    kernel = rw.add_kernel(
        ("quantize_nhwc_" if quantize else "nhwc_") + key,
        lambda: (
            nhwc_stem.to_nhwc4(dims, shape.padding, quantize=quantize)
            if vectorized
            else nhwc_input.to_nhwc_padded(dims, shape.padding, shape.channels, quantize=quantize)
        ),
    )
    scale = [relax.const(match.scale.reshape(()).astype(np.float32))] if quantize else []
    args = [producer.args[0] if quantize else q, *scale, zero_point]
    out = relax.TensorType([shape.n, *shape.padded_hw, shape.channels], "uint8")
    return rw.builder_.emit(relax.call_tir(kernel, args, out))


@dataclass(frozen=True)
class Kernel:
    """A convolution kernel for one shape: its name, its builder (by output dtype), the packed weight,
    and where the kernel's per-channel constants are not in channel order, the channel of each of
    their positions (``colsum`` and the requantize table are indexed with it)."""

    name: str
    build: Callable[[str], Any]
    packed: np.ndarray
    lanes: np.ndarray | None = None


@dataclass(frozen=True)
class ConvMatch:
    """The uint8 input ``q`` (NHWC if ``nhwc``) with its scalar ``scale`` / ``zero``, the int8 weight and
    its per-channel scale."""

    q: Any
    nhwc: bool
    scale: np.ndarray
    zero: np.ndarray
    weight: np.ndarray
    weight_scale: np.ndarray
    shape: ConvShape


class QdqConvToVnni(Rule):
    """``conv2d(dequantize(q_u8), dequantize(w_s8))`` -> an integer kernel: VNNI implicit GEMM
    (``groups == 1``), or the depthwise kernel (``QdqDepthwiseConv``); NHWC in and out (``Twins``)."""

    name = "conv2d"

    def __init__(self, twins: Twins, builders: KernelBuilders | None = None) -> None:
        self.twins = twins
        self.builders = builders or KernelBuilders()

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return (
            op_name(call) == "relax.nn.conv2d"
            and self._groups_match(int(call.attrs.groups))
            and self._input(call.args[0], bound) is not None
            and op_name(bound(call.args[1])) == "relax.dequantize"
        )

    def _input(self, x: Any, bound: Callable[[Any], Any]) -> tuple[Any, bool] | None:
        """The ``dequantize`` producing ``x``, and whether it is channels-last (``x`` its twin's transpose)."""
        if op_name(bound(x)) == "relax.dequantize":
            return bound(x), False
        twin = self.twins.of(x, bound)
        if twin is not None and op_name(bound(twin)) == "relax.dequantize":
            return bound(twin), True
        return None

    @staticmethod
    def _groups_match(groups: int) -> bool:
        return groups == 1

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        found = self._input(call.args[0], rw.bound)
        assert found is not None  # ``matches`` checked it
        (x, nhwc), w = found, rw.bound(call.args[1])
        q, s, z = x.args
        weight, sw, zw = (constant_value(rw.bound(e)) for e in w.args)
        scale, zero = constant_value(s), constant_value(z)
        if str(q.ty.dtype) != "uint8" or scale is None or zero is None or scale.size != 1 or zero.size != 1:
            return MatchResult.fail("convolution input is not uint8 with one constant scale and zero point")
        if weight is None or sw is None or zw is None or weight.dtype != np.int8 or np.any(zw != 0):
            return MatchResult.fail("convolution weight is not a constant symmetric int8 tensor")
        x_shape, w_shape = static_shape(call.args[0]), static_shape(w)
        if x_shape is None or w_shape is None:
            return MatchResult.fail("convolution shape is symbolic")
        shape = conv_shape(call, x_shape, w_shape)
        if isinstance(shape, str):
            return MatchResult.fail(shape)
        return MatchResult(ConvMatch(q, nhwc, scale, zero, weight, sw, shape))

    def rewrite(self, call: Any, match: ConvMatch, rw: Rewriter) -> Any:
        """Pad channels-last, convolve in int32, scale per output channel to float; NCHW twinned to NHWC."""
        from tvm import relax

        shape = match.shape
        zero_point = relax.const(match.zero.reshape(()).astype(np.uint8))
        padded = self._kernel_input(match, zero_point, rw)
        out = rw.builder_.emit(self._kernel_call(rw, shape, padded, zero_point, match.weight))
        per_channel = np.float32(match.scale.reshape(())) * np.broadcast_to(match.weight_scale, (shape.o,))
        scaled = relax.op.multiply(relax.op.astype(out, "float32"), relax.const(per_channel.astype(np.float32)))
        return self.twins.emit_nchw(rw, rw.builder_.emit(scaled))

    def _kernel_input(self, match: ConvMatch, zero_point: Any, rw: Rewriter) -> Any:
        """``q`` channels-last and padded: its NHWC form as is where nothing is to pad, else one pad
        pass; an NCHW ``q`` (where the quantized region
        begins) through ``kernels.nhwc_input``, from the float before its quantize where there is one."""
        from tvm import relax

        source = match.q if match.nhwc else self.twins.of(match.q, rw.bound)
        if source is None:
            return _from_nchw(match, zero_point, rw)
        if not match.shape.needs_copy:
            return source
        shape = match.shape
        dims = (shape.n, shape.h, shape.w, shape.c)
        kernel = rw.add_kernel(
            "pad_nhwc_" + "x".join(str(v) for v in (*dims, *shape.padding, shape.channels)),
            lambda: nhwc_input.pad_nhwc(dims, shape.padding, shape.channels),
        )
        out = relax.TensorType([shape.n, *shape.padded_hw, shape.channels], "uint8")
        return rw.builder_.emit(relax.call_tir(kernel, [source, zero_point], out))

    def _kernel_call(self, rw: Rewriter, shape: ConvShape, padded: Any, zero_point: Any, weight: np.ndarray) -> Any:
        """The ``call_tir`` of the kernel for ``shape`` (added once per shape; its builder registered
        for ``int8_epilogue``, which may rebuild it with a requantizing write-back)."""
        from tvm import relax

        spec = self._kernel(shape, weight)
        self.builders.register(spec.name, spec.build, spec.lanes)
        kernel = rw.add_kernel(spec.name, lambda: spec.build("int32"))
        colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
        colsum = colsum if spec.lanes is None else colsum[spec.lanes]
        args = [padded, relax.const(spec.packed), zero_point, relax.const(colsum)]
        return relax.call_tir(kernel, args, relax.TensorType([shape.n, *shape.out_hw, shape.o], "int32"))

    @staticmethod
    def _kernel(shape: ConvShape, weight: np.ndarray) -> Kernel:
        """The VNNI convolution kernel."""
        key = (*shape.padded_hw, shape.channels, shape.o, shape.kh, shape.kw, *shape.strides, shape.n)
        args = (shape.n, *shape.padded_hw, shape.channels, shape.o, shape.kh, shape.kw, shape.strides, shape.out_hw)
        return Kernel(
            "vnni_conv2d_" + "x".join(str(v) for v in key),
            lambda out_dtype: vnni_conv.conv2d_u8s8(*args, out_dtype),
            vnni_conv.pack_weight(weight, shape.channels),
        )


class QdqDepthwiseConv(QdqConvToVnni):
    """The depthwise case (``groups == C == O``): ``kernels.vnni_depthwise`` where it takes the shape,
    else ``kernels.int8_depthwise`` (fp32 multiply-adds on the integers)."""

    name = "depthwise_conv2d"

    @staticmethod
    def _groups_match(groups: int) -> bool:
        return groups > 1

    @staticmethod
    def _kernel(shape: ConvShape, weight: np.ndarray) -> Kernel:
        key = "x".join(str(v) for v in (*shape.padded_hw, shape.c, shape.kh, shape.kw, *shape.strides, shape.n))
        args = (shape.n, *shape.padded_hw, shape.c, shape.kh, shape.kw, shape.strides, shape.out_hw)
        if not vnni_depthwise.supports(shape.c, shape.strides[1], shape.out_hw[1]):
            return Kernel(
                "vnni_depthwise_" + key,
                lambda out_dtype: vnni_depthwise.depthwise_u8s8(*args, out_dtype),
                vnni_depthwise.pack_weight(weight, shape.out_hw[1]),
                vnni_depthwise.lane_channels(shape.c, shape.out_hw[1]),
            )
        return Kernel(
            "int8_depthwise_" + key,
            lambda out_dtype: int8_depthwise.depthwise_u8s8(*args, out_dtype),
            int8_depthwise.pack_weight(weight),
        )
