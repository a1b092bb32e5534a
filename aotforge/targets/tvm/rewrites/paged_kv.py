"""Paged copies of the decode / verify functions: the cache as a pool of blocks, read through a block table.

``paged_<name>`` is ``<name>`` (after ``kv_inplace`` and ``decode_attention``) with each layer's two cache
arguments ``[batch, kv_heads, max_seq_len, dim]`` replaced by the pool ``[num_blocks, kv_heads, block_size,
dim]`` that every sequence shares, and one more input, ``block_table [batch, table_width]`` (int64): row
``b``'s position ``t`` lives in block ``block_table[b, t // block_size]`` at ``t % block_size``. The in-place
cache write becomes ``kernels.decode_attention.paged_write`` and the attention
``kernels.decode_attention.paged_decode_attention``; the blocks, the block size and the table's width are
symbolic, so one build serves any ``--block-size`` and ``--num-blocks``. The slot functions stay as they are
(``generate()``'s fixed-batch path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aotforge.targets.tvm.kernels import decode_attention as kernels
from aotforge.targets.tvm.relax_util import static_shape

PREFIX = "paged_"


def tir_callee(call: Any, op: str) -> str:
    """The name of the PrimFunc a ``call_tir`` / ``call_tir_inplace`` (``op``) calls; ``""`` for anything else."""
    from tvm import relax

    if isinstance(call, relax.Call) and getattr(call.op, "name", "") == op:
        return str(call.args[0].name_hint)
    return ""


def paged_functions(mod: Any, names: Sequence[str], max_seq_len: int) -> tuple[Any, dict[str, int]]:
    """``mod`` with ``paged_<name>`` added for each of ``names``; how many writes and attentions were paged."""
    from tvm import relax, tirx
    from tvm.relax import PyExprMutator, expr_functor
    from tvm.relax.utils import copy_with_new_vars

    mod = relax.transform.DeadCodeElimination()(mod)  # the views the attention rewrite left unread
    counts = {"writes": 0, "attentions": 0}
    kernel_vars: dict[str, Any] = {}
    blocks, block_size, width = (tirx.Var(n, "int64") for n in ("num_blocks", "block_size", "table_width"))

    @expr_functor.mutator
    class _Pager(PyExprMutator):  # type: ignore[misc]
        table: Any = None
        write_pos: Any = None
        caches: set[Any] = set()

        def add_kernel(self, name: str, make: Any) -> Any:
            if name not in kernel_vars:
                kernel_vars[name] = self.builder_.add_func(make().with_attr("global_symbol", name), name)
            return kernel_vars[name]

        def visit_call_(self, call: Any) -> Any:
            # The two calls are rebuilt from their visited arguments: normalizing the old call over a pool
            # argument would fail its (slot-shaped) type.
            if tir_callee(call, "relax.call_tir_inplace").startswith("kv_scatter_"):
                cache, _, update = (self.visit_expr(a) for a in call.args[1].fields)
                kv, steps, dim = (static_shape(update) or [0, 0, 0, 0])[1:]
                if cache not in self.caches:
                    raise ValueError("a cache write into something else than a cache argument")
                name = f"paged_kv_write_{kv}x{dim}_w{steps}"
                prim = self.add_kernel(name, lambda: kernels.paged_write(kv, dim, steps))
                counts["writes"] += 1
                return relax.call_tir_inplace(prim, [cache, self.table, self.write_pos, update], [0], cache.ty)
            callee = tir_callee(call, "relax.call_tir")
            if callee.startswith("decode_attention_"):
                q, keys, values, pos = (self.visit_expr(a) for a in call.args[1].fields)
                scale, width = (float(x) for x in mod[callee].attrs[kernels.ATTENTION_ATTR])
                _, heads, _, dim = static_shape(q) or [0, 0, 0, 0]
                kv = int(keys.ty.shape[1])
                name = f"paged_{callee}"
                prim = self.add_kernel(
                    name, lambda: kernels.paged_decode_attention(heads, kv, max_seq_len, dim, scale, int(width))
                )
                counts["attentions"] += 1
                return relax.call_tir(prim, [q, keys, values, self.table, pos], call.ty)
            return super().visit_call_(call)

    pager = _Pager(mod)
    for name in names:
        func = copy_with_new_vars(mod[name])  # each var bound once in the module (the original stays)
        params = list(func.params)
        num_input = int(func.attrs["num_input"])
        caches = _cache_params(func)
        write_pos = next(p for p in params if p.name == "write_pos")
        batch = int(write_pos.ty.shape[0])
        table = relax.Var("block_table", relax.TensorType([batch, width], "int64"))
        new_params = []
        pager.caches = set()
        for p in params:
            if p in caches:
                if table not in new_params:
                    new_params.append(table)
                kv, dim = int(p.ty.shape[1]), int(p.ty.shape[3])
                new = relax.Var(p.name, relax.TensorType([blocks, kv, block_size, dim], str(p.ty.dtype)))
                pager.set_var_remap(p, new)
                pager.caches.add(new)
                new_params.append(new)
            else:
                new_params.append(p)
        pager.table, pager.write_pos = table, write_pos
        body = pager.visit_expr(func.body)
        paged = relax.Function(new_params, body, None, func.is_pure, func.attrs)
        paged = paged.with_attr("num_input", num_input + 1)
        paged = paged.with_attr("global_symbol", PREFIX + name)
        pager.builder_.add_func(paged, PREFIX + name)
    return pager.builder_.get(), counts


def _cache_params(func: Any) -> set[Any]:
    """The arguments of ``func`` its in-place cache writes write into."""
    from tvm import relax

    found: set[Any] = set()

    def visit(expr: Any) -> None:
        if tir_callee(expr, "relax.call_tir_inplace").startswith("kv_scatter_"):
            found.add(expr.args[1].fields[0])

    relax.analysis.post_order_visit(func.body, visit)
    return {p for p in func.params if p in found}
