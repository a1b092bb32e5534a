"""``silu(x @ G) * (x @ U)`` over one packed gate / up call -> one gated panel call (``kernels/panel_matmul``,
``gate=``), its weight repacked so each panel holds the same columns of ``G`` and ``U`` (``pack_gated``).

``panel_weights`` packs SwiGLU's gate and up (one input, two weights) side by side as one ``[K, 2F]`` weight and one
call, then slices the two halves back; column ``j`` of ``G`` and column ``j`` of ``U`` then land in panels ``F / tj``
apart, in different tasks, so the SiLU and the product were a kernel of their own: one more launch per layer
(decode step and prompt pass alike) that wrote and read back the ``[rows, 2F]`` pair. Here each panel holds ``tj / 2``
columns of ``G`` then the same of ``U``, and the task that sums them writes ``silu(g) * u`` once, ``[rows, F]``.

The rule is over the graph, not a model: ``multiply(multiply(a, sigmoid(a)), b)`` (any operand order), ``a`` and
``b`` (through a reshape) the two halves of one panel call's columns, that call's output read by nothing else. The
sigmoid is computed as the pipeline would have compiled the graph's (``fast_math``: ``rewrites/fast_gelu``). The
packed weight is renamed ``.g<tj>``; a pair some function still reads whole keeps its side-by-side copy too.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from tvm import relax

from aotforge.targets.tvm.kernels import panel_matmul as kernel
from aotforge.targets.tvm.relax_util import op_name, relax_functions, static_shape, var_uses
from aotforge.targets.tvm.rewrites.panel_epilogue import panel_dims
from aotforge.targets.tvm.rewrites.weight_args import with_arguments

_PREFIX = "panel_matmul_"


def gates_into_panels(mod: Any, packed: dict[str, np.ndarray], fast_math: bool) -> tuple[Any, int]:
    """``mod`` with each SwiGLU product on a gated panel call; how many were taken. ``packed`` (the arrays by
    argument name) gains the gated copies and loses the side-by-side ones no function reads any more."""
    mutator = _Gates(mod, packed, kernel.Gate.FAST_SIGMOID if fast_math else kernel.Gate.SIGMOID)
    for gv, func in relax_functions(mod):
        mutator.uses, mutator.added = var_uses(func), {}
        new = relax.analysis.remove_all_unused(mutator.visit_expr(func))
        mutator.builder_.update_func(gv, with_arguments(new, list(mutator.added.values())))
    mod = mutator.builder_.get()
    read = {str(p.name) for _, func in relax_functions(mod) for p in func.params}
    for name in mutator.replaced - read:
        del packed[name]
    return mod, mutator.taken


@relax.expr_functor.mutator
class _Gates(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any, packed: dict[str, np.ndarray], gate: kernel.Gate) -> None:
        super().__init__(mod)
        self.packed = packed
        self.gate = gate
        self.uses: Counter[Any] = Counter()
        self.added: dict[str, Any] = {}
        self.kernels: dict[str, Any] = {}
        self.replaced: set[str] = set()
        self.taken = 0

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if op_name(call) != "relax.multiply":
            return call
        for gated, up in (call.args, call.args[::-1]):
            fused = self.fused(gated, up, static_shape(call))
            if fused is not None:
                return fused
        return call

    def fused(self, gated: Any, up: Any, shape: list[int] | None) -> Any:
        """``silu(g) * up`` as one gated panel call, or ``None`` when the rule does not hold."""
        value = self.value(gated, 1)
        if op_name(value) != "relax.multiply" or shape is None:
            return None
        g = next((a for a, s in (value.args, value.args[::-1]) if self.is_sigmoid_of(s, a)), None)
        if g is None or static_shape(g) != shape or static_shape(up) != shape:
            return None
        gate_half, up_half = self.half(g, 2), self.half(up, 1)
        if gate_half is None or up_half is None or not gate_half[0].same_as(up_half[0]):
            return None
        (call, g_at, rows), u_at = gate_half, up_half[1]
        dims = panel_dims(call)
        if dims is None:
            return None
        padded, k, n = dims
        f = n // 2
        if {g_at, u_at} != {0, f}:
            return None
        x, w = call.args[1].fields
        if int(np.prod(shape)) != rows * f:
            return None
        name = f"{_PREFIX}gate_{padded}x{k}x{n}"
        if name not in self.kernels:
            func = kernel.panel_matmul(padded, k, n, gate=self.gate).with_attr("global_symbol", name)
            self.kernels[name] = self.builder_.add_func(func, name)
        weight = self.gated_weight(w, g_at)
        out = self.builder_.emit(
            relax.call_tir(self.kernels[name], [x, weight], relax.TensorType((padded, f), "float32"))
        )
        if padded != rows:
            out = self.builder_.emit(relax.op.strided_slice(out, [0], [0], [rows]))
        self.taken += 1
        return relax.op.reshape(out, shape)

    def is_sigmoid_of(self, s: Any, a: Any) -> bool:
        value = self.value(s, 1)
        return op_name(value) == "relax.sigmoid" and value.args[0].same_as(a)

    def half(self, expr: Any, uses: int) -> tuple[Any, int, int] | None:
        """``(panel call, first column, rows)`` of the strided slice of a panel call's columns (through a reshape)
        that ``expr`` is, read ``uses`` times, the call read only by its two halves; ``None`` otherwise."""
        value = self.value(expr, uses)
        if op_name(value) == "relax.reshape":
            value = self.value(value.args[0], 1)
        if op_name(value) != "relax.strided_slice" or len(value.args) != 4:
            return None
        source = self.value(value.args[0], 2)
        dims = panel_dims(source)
        if dims is None:
            return None
        axes, begin, end = ([int(v) for v in a] for a in value.args[1:])
        if axes != [0, 1] or len(begin) != 2 or len(end) != 2 or begin[0] != 0 or end[1] - begin[1] != dims[2] // 2:
            return None
        return source, begin[1], end[0]

    def gated_weight(self, w: Any, g_at: int) -> Any:
        """The function's argument for ``w``'s pair repacked gated (``G`` at column ``g_at`` of the pair)."""
        base = str(w.name)
        panels = self.packed[base]
        count, k, tj = panels.shape
        name = f"{base.rsplit('.p', 1)[0]}.g{tj}"
        if name not in self.packed:
            pair = panels.transpose(1, 0, 2).reshape(k, count * tj)
            f = count * tj // 2
            self.packed[name] = kernel.pack_gated(pair[:, g_at : g_at + f], pair[:, f - g_at : 2 * f - g_at], tj)
        self.replaced.add(base)
        if name not in self.added:
            self.added[name] = relax.Var(name, relax.TensorType(self.packed[name].shape, "float32"))
        return self.added[name]

    def value(self, expr: Any, uses: int) -> Any:
        """The value bound to ``expr`` when it is a variable read ``uses`` times; ``None`` otherwise."""
        if not isinstance(expr, relax.Var) or self.uses[expr] != uses:
            return None
        return self.lookup_binding(expr)
