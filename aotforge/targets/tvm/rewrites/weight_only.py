"""Weight-only int4 / int8 for a generative build: ``matmul(x, w)`` on a weight argument -> the packed kernel.

The weights of a generative module are function arguments (``generative/tvm_graphs``), read from
``weights.data`` at load time. Here each matmul whose right operand is such an argument, ``[K, N]``
as it is or ``permute_dims`` of an ``[N, K]`` one (a head tied to the embedding), is replaced by
``kernels/weight_only`` on the weight packed now (int4 with a scale per group, or int8 per
channel): the function takes the packed bytes and scales as two new arguments instead of the
float weight, which it drops where nothing else reads it (a tied embedding's lookup still does).
The packed arrays are the caller's to store; their names say what they are
(``w4096.int4g32.q`` / ``.s``, ``t`` for a weight read transposed). A K that is not a whole number
of groups (576 at group 128) is padded with zero weights and zero activations up to one, as ONNX
Runtime's MatMulNBits pads its last block: the padding adds exact zeros to every dot product. Every
matmul left alone is counted under the reason; on a CPU without AVX-512 VNNI none is taken.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from aotforge.targets.tvm.kernels import weight_only as kernel
from aotforge.targets.tvm.relax_util import op_name, relax_functions
from aotforge.targets.tvm.rewrites import weight_args
from aotforge.targets.tvm.rewrites.weight_args import WeightMatmul


@dataclasses.dataclass(frozen=True)
class WeightOnlyFormat:
    """What the ``weight-only`` pass's parameters mean on tvm: bits, and the int4 group (``block_size``)."""

    bits: int = 4
    group: int = 32

    def __post_init__(self) -> None:
        kernel.check_format(self.bits, self.group)

    @property
    def tag(self) -> str:
        return f"int4g{self.group}" if self.bits == 4 else f"int8g{self.group}"


def weight_only_matmuls(
    mod: Any, read: Callable[[str], np.ndarray], fmt: WeightOnlyFormat, vnni: bool, cpu: str
) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    """``mod`` with the weight matmuls on the packed kernel, the packed arrays by argument name, the report.

    ``read(name)`` is a weight argument's float value (read once per weight, only if it is taken).
    """
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    packed: dict[str, np.ndarray] = {}
    taken: dict[str, str] = {}
    skipped: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    merged: dict[str, int] = {}
    padded_k: dict[str, str] = {}
    kernels: dict[str, Any] = {}

    @expr_functor.mutator
    class _Mutator(PyExprMutator):  # type: ignore[misc]
        params: set[Any] = set()
        added: dict[str, Any] = {}
        #: per input (its name): the weights multiplied by it, packed side by side into one call
        siblings: dict[str, list[str]] = {}
        widths: dict[str, int] = {}
        outputs: dict[str, dict[str, Any]] = {}

        def bound(self, expr: Any) -> Any:
            return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

        def argument(self, name: str, value: np.ndarray) -> Any:
            if name not in self.added:
                self.added[name] = relax.Var(name, relax.TensorType(value.shape, str(value.dtype)))
            return self.added[name]

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if op_name(call) != "relax.matmul":
                return call
            match = weight_args.match(call, self.params, self.bound)
            why = match if isinstance(match, str) else _unsupported(match, fmt)
            if isinstance(match, str) or why:
                skipped[str(why)] += 1
                return call
            if not vnni:
                skipped[f"target {cpu} has no avx512vnni"] += 1
                return call
            return self.rewrite(match)

        def rewrite(self, m: WeightMatmul) -> Any:
            """The kernel's call for ``m`` and its siblings (same input, one call), then ``m``'s columns of it."""
            names = [m.weight.name] if m.transposed else self.siblings.get(str(m.x.name), [m.weight.name])
            names = names if m.weight.name in names else [m.weight.name]
            key = "_".join(names)
            if key not in self.outputs:
                self.outputs[key] = self.emit_packed(m, names, key)
            taken[m.weight.name] = f"[{m.k}, {m.n}]{' (read transposed)' if m.transposed else ''}"
            calls[m.weight.name] += 1
            if len(names) > 1:
                merged[key] = len(names)
            return relax.op.reshape(self.outputs[key][m.weight.name], (*m.shape[:-1], m.n))

        def emit_packed(self, m: WeightMatmul, names: list[str], key: str) -> dict[str, Any]:
            base = f"{key}{'.t' if m.transposed else ''}.{fmt.tag}"
            widths = [m.n] if len(names) == 1 else [self.widths[n] for n in names]
            width = sum(widths)
            n = _padded(width)  # a vocabulary of 264 or 500: zero columns up to whole 16-lane blocks
            k = _padded(m.k, fmt.group)  # K=576 at group 128: zero rows up to whole groups
            if f"{base}.q" not in packed:
                w = read(names[0]) if m.transposed else np.concatenate([read(n) for n in names], axis=1).T
                w = np.pad(w, ((0, n - width), (0, k - m.k)))
                packed[f"{base}.q"], packed[f"{base}.s"] = kernel.pack(w, fmt.bits, fmt.group)
            if k != m.k:
                padded_k[m.weight.name] = f"{m.k} -> {k}"
            q = self.argument(f"{base}.q", packed[f"{base}.q"])
            s = self.argument(f"{base}.s", packed[f"{base}.s"])
            name = f"weight_only_{fmt.tag}_{m.rows}x{k}x{n}"
            if name not in kernels:
                func = kernel.weight_only_matmul(m.rows, k, n, fmt.bits, fmt.group)
                kernels[name] = self.builder_.add_func(func.with_attr("global_symbol", name), name)
            flat = self.builder_.emit(relax.op.reshape(m.x, (m.rows, m.k)))
            if k != m.k:
                flat = self.builder_.emit(relax.op.nn.pad(flat, [0, 0, 0, k - m.k]))
            out = self.builder_.emit(
                relax.call_tir(kernels[name], [flat, q, s], relax.TensorType((m.rows, n), "float32"))
            )
            if n != width:
                out = self.builder_.emit(relax.op.strided_slice(out, [1], [0], [width]))
            if len(names) == 1:
                return {names[0]: out}
            parts = self.builder_.emit(relax.op.split(out, list(np.cumsum(widths)[:-1].tolist()), axis=1))
            return {w: self.builder_.emit(relax.TupleGetItem(parts, i)) for i, w in enumerate(names)}

    def takes(m: WeightMatmul) -> bool:
        return not _unsupported(m, fmt)

    mutator = _Mutator(mod)
    for gv, func in relax_functions(mod):
        mutator.params = set(func.params)
        mutator.added, mutator.outputs = {}, {}
        mutator.siblings, mutator.widths = weight_args.siblings(func, mutator.params, takes)
        new = mutator.visit_expr(func)
        mutator.builder_.update_func(gv, weight_args.with_arguments(new, list(mutator.added.values())))
    mod = mutator.builder_.get()
    report = {
        **_report(fmt, taken, calls, skipped, packed),
        "merged_calls": dict(sorted(merged.items())),
        "k_padded": dict(sorted(padded_k.items())),
    }
    return mod, packed, report


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
        "block_size": fmt.group,
        "scales": "per group of block_size along K" if fmt.bits == 4 else "per output channel",
        "activations": "int8, a scale per block_size along K, quantized per call",
        "weights_taken": dict(sorted(taken.items())),
        "matmuls_taken": sum(calls.values()),
        "matmuls_skipped": dict(skipped),
        "packed_mb": round(sum(a.nbytes for a in packed.values()) / 2**20, 3),
    }
