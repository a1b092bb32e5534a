"""Weight-only int4 / int8 for a generative build: ``matmul(x, w)`` on a weight argument -> the packed kernel.

The weights of a generative module are function arguments (``tvm/decoder/graphs``), read from
the artifact's weight file at load time. Here each matmul whose right operand is such an argument, ``[K, N]``
as it is or ``permute_dims`` of an ``[N, K]`` one (a head tied to the embedding), is replaced by
``kernels/weight_only`` on the weight packed now (int4 with a scale per group, or int8 per
channel): the function takes the packed bytes and scales as two new arguments instead of the
float weight, which it drops where nothing else reads it (a tied embedding's lookup still does).
The packed arrays are the caller's to store; their names say what they are
(``w4096.int4g32.q`` / ``.s``, ``t`` for a weight read transposed). A K that is not a whole number
of groups (576 at group 128) is padded with zero weights and zero activations up to one, as ONNX
Runtime's MatMulNBits pads its last block: the padding adds exact zeros to every dot product. Every
matmul left alone is counted under the reason; on a CPU without AVX-512 VNNI none is taken. The walk
is ``weight_args.PackedWeightMutator``'s, shared with the fp32 panels (``panel_weights``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from tvm import relax

from aotforge.core.decoder_layers import layer_indices
from aotforge.targets.tvm.kernels import weight_only as kernel
from aotforge.targets.tvm.relax_util import static_shape
from aotforge.targets.tvm.rewrites.weight_args import PackedWeightMutator, WeightMatmul, siblings


@dataclasses.dataclass(frozen=True)
class WeightOnlyFormat:
    """What the ``weight-only`` pass's parameters mean on tvm: bits, and the int4 group (``block_size``)."""

    bits: int = 4
    group: int = 32
    #: The LM head's bits (``head_bits``; 0: ``bits``), and its width: the matmul of ``head_n`` outputs (the
    #: vocabulary: no other matmul of a decoder is that wide) is the head.
    head_bits: int = 0
    head_n: int = 0
    #: Decoder layers whose matmuls are packed at 8 bits, of ``layers`` (``weight-only.layers_8bit``).
    layers_8bit: tuple[int, ...] = ()
    layers: int = 0

    def __post_init__(self) -> None:
        kernel.check_format(self.bits, self.group)
        if self.head_bits:
            kernel.check_format(self.head_bits, self.group)

    def of(self, m: WeightMatmul, eight_bit: frozenset[str] = frozenset()) -> WeightOnlyFormat:
        """The format ``m`` is packed in: the head's bits for the head, 8 for a weight of ``eight_bit``."""
        if self.head_bits and self.head_bits != self.bits and m.n == self.head_n:
            return dataclasses.replace(self, bits=self.head_bits, head_bits=0)
        if m.weight.name in eight_bit and self.bits != 8:
            return dataclasses.replace(self, bits=8, head_bits=0)
        return self

    @property
    def tag(self) -> str:
        return f"int4g{self.group}" if self.bits == 4 else f"int8g{self.group}"


def weight_only_matmuls(
    mod: Any, read: Callable[[str], np.ndarray], fmt: WeightOnlyFormat, vnni: bool, cpu: str
) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    """``mod`` with the weight matmuls on the packed kernel, the packed arrays by argument name, the report.

    ``read(name)`` is a weight argument's float value (read once per weight, only if it is taken).
    """
    mutator = _WeightOnly(mod, read, fmt, vnni, cpu)
    mod = mutator.rewrite_module()
    report = {
        **_report(fmt, mutator.taken, mutator.calls, mutator.skipped, mutator.packed),
        "merged_calls": dict(sorted(mutator.merged.items())),
        "k_padded": dict(sorted(mutator.padded_k.items())),
    }
    return mod, mutator.packed, report


@relax.expr_functor.mutator
class _WeightOnly(PackedWeightMutator):
    """Every weight matmul the kernel takes on int4 / int8 weights packed in ``fmt``."""

    def __init__(
        self, mod: Any, read: Callable[[str], np.ndarray], fmt: WeightOnlyFormat, vnni: bool, cpu: str
    ) -> None:
        super().__init__(mod)
        self.read, self.fmt, self.vnni, self.cpu = read, fmt, vnni, cpu
        #: per weight taken: ``[K, N]`` as the report shows it; per weight padded along K: ``K -> padded``
        self.taken: dict[str, str] = {}
        self.padded_k: dict[str, str] = {}
        #: the weight arguments of ``fmt.layers_8bit``'s layers (found per function, :meth:`start_function`)
        self.eight_bit: frozenset[str] = frozenset()

    def start_function(self, func: Any) -> None:
        if self.fmt.layers_8bit:
            self.eight_bit |= _layer_weights(func, set(func.params), self.fmt)
        super().start_function(func)

    def why_not(self, m: WeightMatmul) -> str:
        return _unsupported(m, self.fmt.of(m, self.eight_bit)) or (
            "" if self.vnni else f"target {self.cpu} has no avx512vnni"
        )

    def rewrite(self, m: WeightMatmul) -> Any:
        fmt = self.fmt.of(m, self.eight_bit)
        why = "the head" if m.n == self.fmt.head_n else "layers_8bit"
        bits = "" if fmt is self.fmt else f" at {fmt.bits} bits ({why})"
        self.taken[m.weight.name] = f"[{m.k}, {m.n}]{' (read transposed)' if m.transposed else ''}{bits}"
        return super().rewrite(m)

    def emit(self, m: WeightMatmul, names: list[str]) -> dict[str, Any]:
        fmt = self.fmt.of(m, self.eight_bit)
        base = f"{'_'.join(names)}{'.t' if m.transposed else ''}.{fmt.tag}"
        widths = [self.widths.get(n, m.n) for n in names]
        width = sum(widths)
        n = _padded(width)  # a vocabulary of 264 or 500: zero columns up to whole 16-lane blocks
        k = _padded(m.k, fmt.group)  # K=576 at group 128: zero rows up to whole groups
        if f"{base}.q" not in self.packed:
            read = self.read
            w = read(names[0]) if m.transposed else np.concatenate([read(n) for n in names], axis=1).T
            w = np.pad(w, ((0, n - width), (0, k - m.k)))
            self.packed[f"{base}.q"], self.packed[f"{base}.s"] = kernel.pack(w, fmt.bits, fmt.group)
        if k != m.k:
            self.padded_k[m.weight.name] = f"{m.k} -> {k}"
        q, s = self.argument(f"{base}.q"), self.argument(f"{base}.s")
        func = self.kernel(
            f"weight_only_{fmt.tag}_{m.rows}x{k}x{n}",
            lambda: kernel.weight_only_matmul(m.rows, k, n, fmt.bits, fmt.group),
        )
        flat = self.builder_.emit(relax.op.reshape(m.x, (m.rows, m.k)))
        if k != m.k:
            flat = self.builder_.emit(relax.op.nn.pad(flat, [0, 0, 0, k - m.k]))
        out = self.builder_.emit(relax.call_tir(func, [flat, q, s], relax.TensorType((m.rows, n), "float32")))
        if n != width:
            out = self.builder_.emit(relax.op.strided_slice(out, [1], [0], [width]))
        if len(names) == 1:
            return {names[0]: out}
        parts = self.builder_.emit(relax.op.split(out, list(np.cumsum(widths)[:-1].tolist()), axis=1))
        return {w: self.builder_.emit(relax.TupleGetItem(parts, i)) for i, w in enumerate(names)}


def _layer_weights(func: Any, params: set[Any], fmt: WeightOnlyFormat) -> frozenset[str]:
    """The weight arguments of ``func``'s layers in ``fmt.layers_8bit``: its weight matmuls other than the head,
    in binding order, are ``fmt.layers`` repeats of one layer's (``core.decoder_layers``)."""
    from aotforge.core.errors import OptionsError

    groups, _ = siblings(func, params, lambda m: m.n != fmt.head_n)
    names = [w for members in groups.values() for w in members]
    shapes = {str(p.name): tuple(static_shape(p) or ()) for p in params if str(p.name) in names}
    layer = layer_indices([shapes[n] for n in names], fmt.layers)
    if layer is None:
        raise OptionsError(
            f"tvm weight-only: layers_8bit needs the {len(names)} weight matmuls of a function to be "
            f"{fmt.layers} repeats of one layer's; this module's are not"
        )
    return frozenset(n for n, i in zip(names, layer, strict=True) if i in fmt.layers_8bit)


def _padded(n: int, multiple: int = kernel.LANES) -> int:
    return -(-n // multiple) * multiple


def _unsupported(m: WeightMatmul, fmt: WeightOnlyFormat) -> str:
    """Why the kernel cannot take ``m`` once N is padded to whole lanes and K to whole groups ('' if it can)."""
    return kernel.supports(_padded(m.k, fmt.group), _padded(m.n), fmt.bits, fmt.group)


def _report(
    fmt: WeightOnlyFormat, taken: dict[str, str], calls: Counter[str], skipped: Counter[str], packed: dict[str, Any]
) -> dict[str, Any]:
    """Which weights were packed (``[K, N]``) and the calls they serve, and why each other matmul was not."""
    return {
        "bits": fmt.bits,
        **({"head_bits": fmt.head_bits} if fmt.head_bits and fmt.head_bits != fmt.bits else {}),
        **({"layers_8bit": list(fmt.layers_8bit)} if fmt.layers_8bit else {}),
        "block_size": fmt.group,
        "scales": "per group of block_size along K" if fmt.bits == 4 else "per output channel",
        "activations": "int8, a scale per block_size along K, quantized per call",
        "weights_taken": dict(sorted(taken.items())),
        "matmuls_taken": sum(calls.values()),
        "matmuls_skipped": dict(skipped),
        "packed_mb": round(sum(a.nbytes for a in packed.values()) / 2**20, 3),
    }
