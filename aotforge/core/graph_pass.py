"""What every aotforge graph rewrite is: an onnx-ir in-place pass with typed parameters and stats (``passes/``
and the targets' own import steps alike, so it lives on the ground floor).

A pass subclasses :class:`GraphPass`, declares ``Params`` (a frozen dataclass), and in
``call`` fills ``self.stats`` with what it changed. The manager records both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import onnx_ir as ir
import onnx_ir.passes

from aotforge.core.decoder import GraphRole


@dataclasses.dataclass(frozen=True)
class NoParams:
    """For passes without parameters."""


class GraphPass(onnx_ir.passes.InPlacePass):
    """Base of aotforge's passes: ``name`` for the manifest, ``params`` typed, ``stats`` filled by ``call``."""

    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    #: True for passes that change numerics (precision, quantization, sparsity).
    changes_numerics: ClassVar[bool] = False

    def __init__(self, params: Any = None) -> None:
        super().__init__()
        self.params = params if params is not None else self.Params()
        self.stats: dict[str, Any] = {}

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        raise NotImplementedError

    def for_graph(self, role: GraphRole) -> GraphPass:
        """This pass as it runs on a decoder graph of ``role``: itself, unless its parameters depend on the role."""
        return self


def count_nodes(model: ir.Model) -> int:
    """Nodes in the main graph and every subgraph and function."""
    total = sum(1 for _ in model.graph.all_nodes())
    return total + sum(len(f) for f in model.functions.values())
