"""What the rewrites that repack a generative build's weights share (``weight_only``, ``panel_weights``).

The weights of a generative module are function arguments (``generative/tvm_graphs``), read from
``weights.data`` at load time. A rewrite that stores a weight in another layout finds each
``matmul(x, w)`` on such an argument (:func:`match`), groups those that multiply one input
(:func:`siblings`: Q / K / V, gate / up, one kernel call for each group), and gives the function
the packed tensors as new arguments, dropping the ones its body no longer reads
(:func:`with_arguments`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from aotforge.targets.tvm.relax_util import op_name, static_shape


@dataclasses.dataclass(frozen=True)
class WeightMatmul:
    x: Any
    weight: Any  # the Relax argument
    transposed: bool
    rows: int
    k: int
    n: int
    shape: list[int]


def match(call: Any, params: set[Any], bound: Callable[[Any], Any]) -> WeightMatmul | str:
    """The fp32 weight matmul ``call`` is (``[K, N]`` as it is, or ``permute_dims`` of an ``[N, K]`` one: a
    head tied to the embedding), or why it is not one."""
    from tvm import relax

    w, transposed = call.args[1], False
    if op_name(bound(w)) == "relax.permute_dims" and len(static_shape(w) or []) == 2:
        w, transposed = bound(w).args[0], True
    if not isinstance(w, relax.Var) or w not in params:
        return "the right operand is not a weight argument"
    shape, w_shape = static_shape(call.args[0]), static_shape(w)
    if shape is None or w_shape is None or len(w_shape) != 2:
        return "not a static [.., K] x 2-D weight"
    if str(call.args[0].ty.dtype) != "float32" or str(w.ty.dtype) != "float32":
        return "not float32"
    k, n = (w_shape[1], w_shape[0]) if transposed else (w_shape[0], w_shape[1])
    if shape[-1] != k:
        return "not a [.., K] x [K, N] matmul"
    return WeightMatmul(call.args[0], w, transposed, int(np.prod(shape[:-1])), k, n, shape)


def siblings(
    func: Any, params: set[Any], takes: Callable[[WeightMatmul], bool]
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The weights (in binding order) that each input of ``func`` multiplies, and each one's width N.

    Q, K and V read one normalized input, as do the MLP's gate and up: their packed weights side by
    side make one kernel call (one parallel launch, one pass over the input) instead of three or two;
    the output is split back. Only matmuls ``takes`` accepts count; weights read transposed (a head)
    stay alone."""
    from tvm import relax

    values = relax.analysis.get_var2val(func)
    groups: dict[str, list[str]] = {}
    widths: dict[str, int] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if op_name(call) != "relax.matmul":
                continue
            m = match(call, params, lambda e: values.get(e) if isinstance(e, relax.Var) else e)
            if isinstance(m, str) or m.transposed or not takes(m):
                continue
            members = groups.setdefault(str(m.x.name), [])
            if m.weight.name not in members:
                members.append(m.weight.name)
            widths[m.weight.name] = m.n
    return groups, widths


def with_arguments(func: Any, added: list[Any]) -> Any:
    """``func`` taking ``added`` after its arguments, less the weight arguments its body no longer reads."""
    from tvm import relax

    if not added:
        return func
    func = relax.analysis.remove_all_unused(func)  # e.g. the permute_dims of a head read from panels now
    used = set(relax.analysis.free_vars(func.body))
    inputs = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else 0
    params = list(func.params[:inputs]) + [p for p in func.params[inputs:] if p in used] + added
    return relax.Function(params, func.body, func.ret_ty, func.is_pure, func.attrs)
