"""What the rewrites that repack a generative build's weights share (``weight_only``, ``panel_weights``).

The weights of a generative module are function arguments (``tvm/decoder/graphs``), read from
the artifact's weight file at load time. A rewrite that stores a weight in another layout finds each
``matmul(x, w)`` on such an argument (:func:`match`), groups those that multiply one input
(:func:`siblings`: Q / K / V, gate / up, one kernel call for each group), and gives the function
the packed tensors as new arguments, dropping the ones its body no longer reads
(:func:`with_arguments`). :class:`PackedWeightMutator` is that walk; a rewrite says which matmuls
its kernel takes and how to call it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from tvm import relax

from aotforge.targets.tvm.relax_util import op_name, relax_functions, static_shape


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
    if not added:
        return func
    func = relax.analysis.remove_all_unused(func)  # e.g. the permute_dims of a head read from panels now
    used = set(relax.analysis.free_vars(func.body))
    inputs = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else 0
    params = list(func.params[:inputs]) + [p for p in func.params[inputs:] if p in used] + added
    return relax.Function(params, func.body, func.ret_ty, func.is_pure, func.attrs)


class PackedWeightMutator(relax.PyExprMutator):  # type: ignore[misc]
    """One walk over a module's Relax functions putting the weight matmuls a kernel takes on packed copies.

    A rewrite subclasses it (decorated ``@relax.expr_functor.mutator``) and says why its kernel cannot
    take a matmul (:meth:`why_not`) and how to call the kernel for a group of sibling weights
    (:meth:`emit`, packing them into :attr:`packed` the first time); :meth:`rewrite_module` runs it. Each
    group gets one call per function, its output shared by the group's matmuls.
    """

    def __init__(self, mod: Any) -> None:
        super().__init__(mod)
        #: the packed arrays by argument name (the caller stores them), and the kernels added by name
        self.packed: dict[str, np.ndarray] = {}
        self.kernels: dict[str, Any] = {}
        #: matmuls taken per weight, left alone per reason, and the groups of several weights (by key)
        self.calls: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.merged: dict[str, int] = {}
        # Per function (start_function): its arguments, the packed ones it gains, per input the weights it
        # multiplies and each one's width N, and each group's outputs by weight.
        self.params: set[Any] = set()
        self.added: dict[str, Any] = {}
        self.groups: dict[str, list[str]] = {}
        self.widths: dict[str, int] = {}
        self.outputs: dict[str, dict[str, Any]] = {}

    def why_not(self, m: WeightMatmul) -> str:
        """Why the kernel cannot take ``m`` ('' when it can)."""
        return ""

    def emit(self, m: WeightMatmul, names: list[str]) -> dict[str, Any]:
        """The kernel's call for the weights ``names`` (``m`` reads one of them), each one's columns of its output."""
        raise NotImplementedError

    def rewrite_module(self) -> Any:
        """The module with every Relax function rewritten, each taking its packed weights as new arguments."""
        for gv, func in relax_functions(self.builder_.get()):
            self.start_function(func)
            new = self.visit_expr(func)
            self.builder_.update_func(gv, with_arguments(new, list(self.added.values())))
        return self.builder_.get()

    def start_function(self, func: Any) -> None:
        self.params = set(func.params)
        self.added, self.outputs = {}, {}
        self.groups, self.widths = siblings(func, self.params, lambda m: not self.why_not(m))

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if op_name(call) != "relax.matmul":
            return call
        m = match(call, self.params, self.bound)
        why = m if isinstance(m, str) else self.why_not(m)
        if isinstance(m, str) or why:
            self.skipped[why] += 1
            return call
        return self.rewrite(m)

    def rewrite(self, m: WeightMatmul) -> Any:
        """``m`` as its columns of its group's call (emitted by the group's first matmul)."""
        names = [m.weight.name] if m.transposed else self.groups.get(str(m.x.name), [m.weight.name])
        names = names if m.weight.name in names else [m.weight.name]
        key = "_".join(names) + (".t" if m.transposed else "")
        if key not in self.outputs:
            self.outputs[key] = self.emit(m, names)
        self.calls[m.weight.name] += 1
        if len(names) > 1:
            self.merged[key] = len(names)
        return relax.op.reshape(self.outputs[key][m.weight.name], (*m.shape[:-1], m.n))

    def bound(self, expr: Any) -> Any:
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

    def argument(self, name: str) -> Any:
        """The function's argument for ``packed[name]`` (added once per function)."""
        if name not in self.added:
            value = self.packed[name]
            self.added[name] = relax.Var(name, relax.TensorType(value.shape, str(value.dtype)))
        return self.added[name]

    def kernel(self, name: str, make: Callable[[], Any]) -> Any:
        """The global of the PrimFunc ``make()`` builds, added to the module the first time ``name`` is asked for."""
        if name not in self.kernels:
            self.kernels[name] = self.builder_.add_func(make().with_attr("global_symbol", name), name)
        return self.kernels[name]
