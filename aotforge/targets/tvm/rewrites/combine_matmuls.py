"""Matmuls that share their input and have constant weights -> one matmul, sliced (Q/K/V).

An attention layer of every HF encoder export (``torch.onnx.export``, both exporters) projects the
same hidden states three times: ``add(matmul(x, Wq), bq)``, the same with ``Wk``, ``Wv``. Three
kernels of ``tokens x hidden x hidden`` each are small at ViT's 37 tokens (a fork/join and a
weight-panel stream per kernel); one ``x @ [Wq | Wk | Wv] + [bq | bk | bv]`` has three times the
columns for the tiled schedule, and one strided slice per projection that fuses into the
reshape / transpose kernel following it. Numerics are unchanged: every output column is the
same dot product in the same order.

TVM's own ``CombineParallelMatmul`` wants the weights as function parameters; the importers give
constants, so it leaves them alone.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

from aotforge.targets.tvm.relax_util import constant_value, op_name, relax_functions, rewrite_functions


@dataclasses.dataclass(frozen=True)
class _Branch:
    """One projection: ``out = add(matmul(x, weight), bias)`` (``bias`` ``None``: ``out`` is the matmul)."""

    out: Any
    x: Any
    weight: np.ndarray
    bias: np.ndarray | None


def _uses(func: Any) -> collections.Counter[Any]:
    from tvm import relax

    counts: collections.Counter[Any] = collections.Counter()

    def visit(e: Any) -> None:
        if isinstance(e, relax.Call):
            for a in e.args:
                if isinstance(a, relax.Var):
                    counts[a] += 1

    relax.analysis.post_order_visit(func, visit)
    return counts


def _constant(expr: Any, bound: dict[Any, Any]) -> np.ndarray | None:
    """A constant, or a transposed one (``Gemm(transB=1)``, ``nn.Linear`` through torch.export)."""
    value = bound.get(expr, expr)
    if op_name(value) == "relax.permute_dims":
        inner = constant_value(value.args[0])
        axes = [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else None
        return None if inner is None else np.ascontiguousarray(np.transpose(inner, axes))
    return constant_value(value)


def _source(x: Any, bound: dict[Any, Any]) -> Any:
    """What identifies ``x`` across branches: a reshape of one tensor made once per branch is that tensor."""
    value = bound.get(x, x)
    if op_name(value) == "relax.reshape":
        return (value.args[0], tuple(int(d) for d in x.ty.shape))
    return x


def _projection(call: Any, bound: dict[Any, Any]) -> tuple[Any, np.ndarray] | None:
    """``(x, weight)`` of a float32 ``matmul(x, constant 2-D weight)``; ``None`` otherwise."""
    if op_name(call) != "relax.matmul":
        return None
    weight = _constant(call.args[1], bound)
    if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
        return None
    return call.args[0], weight


def _bias(call: Any, matmul_var: Any, columns: int) -> np.ndarray | None:
    """The constant ``[columns]`` bias of ``add(matmul_var, bias)`` (either order); ``None`` otherwise."""
    if op_name(call) != "relax.add":
        return None
    a, b = call.args
    other = b if a.same_as(matmul_var) else a if b.same_as(matmul_var) else None
    value = constant_value(other) if other is not None else None
    if value is None or value.dtype != np.float32 or value.size != columns or value.ndim > 1:
        return None
    return value.reshape(columns)


def find_groups(func: Any) -> list[list[_Branch]]:
    """Per dataflow block, the projections of one input, grouped (two or more, same bias-ness)."""
    from tvm import relax

    uses = _uses(func)
    groups: list[list[_Branch]] = []
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        bound = {b.var: b.value for b in block.bindings}
        matmuls: dict[Any, tuple[Any, np.ndarray]] = {}
        found: dict[tuple[Any, bool], list[_Branch]] = collections.defaultdict(list)
        biased: set[Any] = set()
        for binding in block.bindings:
            proj = _projection(binding.value, bound)
            if proj is not None:
                matmuls[binding.var] = proj
                continue
            for var, (x, weight) in matmuls.items():
                bias = _bias(binding.value, var, weight.shape[1])
                if bias is not None and uses[var] == 1:
                    found[(_source(x, bound), True)].append(_Branch(binding.var, x, weight, bias))
                    biased.add(var)
                    break
        for var, (x, weight) in matmuls.items():
            if var not in biased:
                found[(_source(x, bound), False)].append(_Branch(var, x, weight, None))
        groups += [g for g in found.values() if len(g) > 1 and len({b.weight.shape[0] for b in g}) == 1]
    return groups


def _mutator(groups: list[list[_Branch]]) -> Any:
    from tvm import relax

    first = {g[0].out: g for g in groups}  # relax vars hash and compare by identity
    later = {b.out for g in groups for b in g[1:]}

    @relax.expr_functor.mutator
    class _Combine(relax.PyExprMutator):  # type: ignore[misc]
        def visit_var_binding_(self, binding: Any) -> None:
            key = binding.var
            if key in later:
                return  # bound by its group's slices
            if key not in first:
                super().visit_var_binding_(binding)
                return
            group = first[key]
            x = self.visit_expr(group[0].x)
            y = self.builder_.emit(relax.op.matmul(x, relax.const(np.concatenate([b.weight for b in group], axis=1))))
            if group[0].bias is not None:
                bias = np.concatenate([b.bias for b in group if b.bias is not None])
                y = self.builder_.emit(relax.op.add(y, relax.const(bias)))
            # One strided slice per branch, not a split: a slice is injective and fuses into the
            # reshape / transpose kernel that follows each projection, where a split is a kernel of
            # its own copying every column once more (ViT: 4 kernels and 12 buffers per call).
            axis = int(y.ty.ndim) - 1
            start = 0
            for branch in group:
                stop = start + int(branch.weight.shape[1])
                part = self.builder_.emit(relax.op.strided_slice(y, axes=[axis], begin=[start], end=[stop]))
                self.set_var_remap(branch.out, part)
                start = stop

    return _Combine


def combine_matmuls(mod: Any) -> tuple[Any, dict[str, Any] | None]:
    """``mod`` with parallel projections merged; the report (``None`` when nothing merged)."""
    from tvm import relax

    groups = [g for _, func in relax_functions(mod) for g in find_groups(func)]
    if not groups:
        return mod, None
    mod = rewrite_functions(_mutator(groups), mod)
    return relax.transform.DeadCodeElimination()(mod), {"groups": len(groups), "branches": [len(g) for g in groups]}
