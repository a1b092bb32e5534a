"""fp32 ``matmul(x, w)`` on a generative build's ``[K, N]`` weight arguments -> ``kernels/panel_matmul``.

A generative build passes its weights as arguments, which the matmul schedule cannot pack at
compile time: the prefill's tiled matmuls read every ``K x 48`` panel at the row stride of N, and a
decode step's few rows took a kernel of their own (``gemv_kn``) whose accumulators lived in memory.
Here each such weight is stored packed once, at build time, as ``[N / tj, K, tj]`` panels
(``w4096.p48``), and every function that reads it (prefill buckets, decode, verify) calls the panel
kernel on that one copy: the function takes the packed tensor as a new argument and drops the
original where nothing else reads it. Weights that multiply one input (Q / K / V, gate / up) are
packed side by side into one weight and one call, then sliced back. An N that is not a multiple of
16 lanes is padded with zero columns (sliced off), a prompt bucket with no row tile from 4 to 8
with zero rows. A head tied to the embedding (``matmul(x, permute_dims(E))``) is packed from ``E``'s
transpose (``w0.t.p48``), and the embedding's lookup (``take(E, ids)``) then reads its rows out of
those panels (``panel_rows``): the tied weight is not stored twice either. The packed arrays are
the caller's to store. A residual added to a product is added inside the kernel (``rewrites/panel_epilogue``),
and SwiGLU's ``silu(gate) * up`` computed inside the gate / up call (``rewrites/panel_gate``). The walk is
``weight_args.PackedWeightMutator``'s, shared with ``weight_only``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from tvm import relax

from aotforge.targets.tvm.kernels import panel_matmul as kernel
from aotforge.targets.tvm.relax_util import op_name, static_shape
from aotforge.targets.tvm.rewrites import weight_args
from aotforge.targets.tvm.rewrites.panel_epilogue import residuals_into_panels
from aotforge.targets.tvm.rewrites.panel_gate import gates_into_panels
from aotforge.targets.tvm.rewrites.weight_args import PackedWeightMutator, WeightMatmul


def panel_matmuls(
    mod: Any,
    read: Callable[[str], np.ndarray],
    few: kernel.FewRows = kernel.FewRows.SPLIT,
    fast_math: bool = True,
) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    """``mod`` with the fp32 weight matmuls on the panel kernel, the packed arrays by argument name, the report.

    ``read(name)`` is a weight argument's value (read once per packed weight); ``few``, how the kernel tiles a
    decode step's rows (``kernel.few_rows`` of the target's CPU); ``fast_math``, the build's (a SwiGLU gate
    computed in the kernel computes its sigmoid as the pipeline would have).
    """
    mutator = _Panels(mod, read, few)
    packed = mutator.packed
    mod, gates = gates_into_panels(mutator.rewrite_module(), packed, fast_math)
    mod, residuals = residuals_into_panels(mod, few)
    report = {
        "weights_packed": {name: list(a.shape) for name, a in sorted(packed.items())},
        "matmuls_taken": sum(mutator.calls.values()),
        "merged_calls": len(mutator.merged),
        "lookups_from_panels": sum(mutator.lookups.values()),
        "gates_in_kernel": gates,
        "residuals_added_in_kernel": residuals,
        "matmuls_skipped": dict(mutator.skipped),
        "packed_mb": round(sum(a.nbytes for a in packed.values()) / 2**20, 3),
        "few_rows": few.value,
    }
    return mod, packed, report


@relax.expr_functor.mutator
class _Panels(PackedWeightMutator):
    """Every fp32 weight matmul on the panel kernel; an embedding lookup of a packed head from its panels."""

    def __init__(self, mod: Any, read: Callable[[str], np.ndarray], few: kernel.FewRows) -> None:
        super().__init__(mod)
        self.read = read
        self.few = few
        self.lookups: Counter[str] = Counter()
        #: per function: the weights a matmul reads transposed (a head), by name: ``[N, K]``
        self.tied: dict[str, tuple[int, int]] = {}

    def start_function(self, func: Any) -> None:
        super().start_function(func)
        self.tied = _read_transposed(func, self.params)

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        return self.lookup(call) if op_name(call) == "relax.take" else call

    def panels(self, names: list[str], width: int, transposed: bool) -> Any:
        """The function's argument for ``names`` packed side by side (``width`` columns), packed the first time."""
        n = _lanes(width)
        name = f"{'_'.join(names)}{'.t' if transposed else ''}.p{kernel.panel_width(n)}"
        if name not in self.packed:
            read = self.read
            w = read(names[0]).T if transposed else np.concatenate([read(w) for w in names], axis=1)
            self.packed[name] = kernel.pack(
                np.pad(w.astype(np.float32), ((0, 0), (0, n - width))), kernel.panel_width(n)
            )
        return self.argument(name)

    def lookup(self, call: Any) -> Any:
        """``take(E, ids, axis=0)`` of an embedding whose transpose is a packed head -> rows of its panels."""
        table, ids = call.args
        if table not in self.params or table.name not in self.tied or int(call.attrs.axis or 0) != 0:
            return call
        (vocab, k), shape = self.tied[table.name], static_shape(ids) or []
        count = int(np.prod(shape)) if shape else 0
        if count == 0 or str(ids.ty.dtype) not in ("int32", "int64"):
            return call
        func = self.kernel(
            f"panel_rows_{count}x{k}x{_lanes(vocab)}_{ids.ty.dtype}",
            lambda: kernel.panel_rows(count, k, _lanes(vocab), str(ids.ty.dtype)),
        )
        flat = self.builder_.emit(relax.op.reshape(ids, (count,)))
        weight = self.panels([table.name], vocab, transposed=True)
        rows = self.builder_.emit(relax.call_tir(func, [flat, weight], relax.TensorType((count, k), "float32")))
        self.lookups[table.name] += 1
        return relax.op.reshape(rows, (*shape, k))

    def emit(self, m: WeightMatmul, names: list[str]) -> dict[str, Any]:
        """The kernel's call for ``names`` (one packed weight), then each weight's columns of its output."""
        widths = [self.widths.get(n, m.n) for n in names]
        width = sum(widths)
        n = _lanes(width)
        weight = self.panels(names, width, m.transposed)
        rows = kernel.padded_rows(m.rows)
        func = self.kernel(f"panel_matmul_{rows}x{m.k}x{n}", lambda: kernel.panel_matmul(rows, m.k, n, few=self.few))
        x = self.builder_.emit(relax.op.reshape(m.x, (m.rows, m.k)))
        if rows != m.rows:
            x = self.builder_.emit(relax.op.nn.pad(x, [0, rows - m.rows, 0, 0]))
        out = self.builder_.emit(relax.call_tir(func, [x, weight], relax.TensorType((rows, n), "float32")))
        parts, start = {}, 0
        for w, cols in zip(names, widths, strict=True):
            if (start, cols, rows) == (0, n, m.rows):
                parts[w] = out
            else:
                end = [m.rows, start + cols]
                parts[w] = self.builder_.emit(relax.op.strided_slice(out, [0, 1], [0, start], end))
            start += cols
        return parts


def _lanes(n: int) -> int:
    return -(-n // kernel.LANES) * kernel.LANES


def _read_transposed(func: Any, params: set[Any]) -> dict[str, tuple[int, int]]:
    """The weight arguments of ``func`` that a matmul reads transposed (a head tied or not), by name: ``[N, K]``."""
    values = relax.analysis.get_var2val(func)
    out: dict[str, tuple[int, int]] = {}

    def visit(e: Any) -> None:
        if op_name(e) == "relax.matmul":
            m = weight_args.match(e, params, lambda v: values.get(v) if isinstance(v, relax.Var) else v)
            if not isinstance(m, str) and m.transposed:
                out[m.weight.name] = (m.n, m.k)

    relax.analysis.post_order_visit(func, visit)
    return out
