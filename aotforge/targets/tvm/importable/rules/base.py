"""What a legalize rule is: an onnxscript rewrite rule about one op, and what the rules read of a value.

A rule's pattern is its op (any inputs, attributes; a fixed count of outputs, as onnxscript's patterns
have: a rule taking several counts is one rewrite rule per count). ``check_node`` says whether it
applies, or why not (``MatchResult.fail(reason)``), and may keep what it found for ``rewrite_node``,
which builds the replacement with the rewriter's op builder. What most rules need first (an input's type, its
static shape, its constant value) is declared (``typed``, ``shaped``, ``constants``) and checked here; every
reason a rule declines a node is counted (``RuleRun.declined``) and lands in the step's report, so the manifest
says why a node the importer lacks was left alone. Each rule runs once per node the graph
had before the legalize step (never on what a rule made), only in the main graph, first match wins.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript.rewriter import pattern

FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
MatchResult = pattern.MatchResult


@dataclasses.dataclass
class RuleRun:
    """What the rules of one legalize step share: the nodes they may rewrite, the opset, counts by rule."""

    nodes: set[ir.Node]
    graph: ir.Graph
    #: The model's ai.onnx opset: where ``axes`` is an attribute or an input.
    opset: int
    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    #: ``"rule: reason"`` -> how many nodes of the rule's op it declined for that reason.
    declined: Counter[str] = dataclasses.field(default_factory=Counter)


class NodeRule(pattern.RewriteRuleClassBase):
    """A rule about one op (see the module's docstring): subclasses set ``ops`` and write ``check_node`` and
    ``rewrite_node``; ``report_name`` is the rule's key in the report."""

    report_name: ClassVar[str]
    ops: ClassVar[tuple[str, ...]]
    #: The output counts it takes (one rewrite rule each).
    outputs: ClassVar[Sequence[int]] = (1,)
    #: Inputs (by position) whose type, static shape or constant value the rule reads: a node lacking one is
    #: declined with that reason before ``check_node`` runs.
    typed: ClassVar[tuple[int, ...]] = ()
    shaped: ClassVar[tuple[int, ...]] = ()
    constants: ClassVar[tuple[int, ...]] = ()

    def __init__(self, run: RuleRun, op_type: str, outputs: int) -> None:
        super().__init__(f"{self.report_name}:{op_type}:{outputs}")
        self.run, self.op_type, self.num_outputs = run, op_type, outputs
        self.node: ir.Node | None = None

    @classmethod
    def rules(cls, run: RuleRun) -> list[pattern.RewriteRule]:
        return [cls.rule(run, op_type, k) for op_type in cls.ops for k in cls.outputs]

    def pattern(self, op: Any, x: Any) -> Any:
        return getattr(op, self.op_type)(x, _allow_other_inputs=True, _outputs=self.num_outputs)

    def check(self, op: Any, *args: Any, **kwargs: Any) -> MatchResult:
        node = op.root  # ``op`` is the match context here (onnxscript's name for the argument)
        if node not in self.run.nodes or node.graph is not self.run.graph:
            return MatchResult().fail("made by a rule, or in a subgraph")
        if node.domain not in ("", "ai.onnx") or len(node.outputs) != self.num_outputs:
            return MatchResult().fail("another domain or count of outputs")
        self.node = node
        result = self._unknown_inputs(node) or self.check_node(node)
        if not result:
            self.run.declined[f"{self.report_name}: {result.reason}"] += 1
        return result

    def _unknown_inputs(self, node: ir.Node) -> MatchResult | None:
        """The first declared input the node does not give as the rule needs it, as a decline; else None."""
        for k in self.typed:
            if dtype(input_(node, k)) is None:
                return MatchResult().fail(f"input {k}'s type unknown")
        for k in self.shaped:
            if shape(input_(node, k)) is None:
                return MatchResult().fail(f"input {k}'s shape unknown")
        for k in self.constants:
            if const(input_(node, k)) is None:
                return MatchResult().fail(f"input {k} not constant")
        return None

    def rewrite(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.node is not None  # check ran first
        outputs = self.rewrite_node(op, self.node)
        self.run.counts[self.report_name] += 1
        self.run.nodes.discard(self.node)
        if not isinstance(outputs, (list, tuple)):
            return outputs
        # an output the node does not give (an empty name): a placeholder nothing reads
        return [v if v is not None else op.Constant(value=ir.tensor(np.zeros(0, np.float32))) for v in outputs]

    def check_node(self, node: ir.Node) -> MatchResult:
        """Whether the rule takes ``node``, beyond the declared inputs (default: it does)."""
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        raise NotImplementedError

    def axes_op(self, op: Any, op_type: str, inputs: Sequence[Any], axes: Sequence[int], **attrs: Any) -> Any:
        """``op_type`` (Unsqueeze, Squeeze or a Reduce*) over ``axes``, an input or an attribute as the opset has it."""
        as_input = self.run.opset >= (18 if op_type.startswith("Reduce") and op_type != "ReduceSum" else 13)
        if not as_input:
            return getattr(op, op_type)(*inputs, axes=list(axes), **attrs)
        return getattr(op, op_type)(*inputs, constant(op, np.array(axes, np.int64)), **attrs)


def constant(op: Any, value: Any) -> Any:
    return op.Constant(value=ir.tensor(np.asarray(value)))


def const(value: ir.Value | None) -> np.ndarray | None:
    """The value's array when it is a constant (an initializer or a Constant node's)."""
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's static shape (a constant's own), else None."""
    if value is None:
        return None
    if value.shape is not None and all(isinstance(d, int) for d in value.shape):
        return tuple(int(d) for d in value.shape)  # type: ignore[arg-type]
    array = const(value)
    return None if array is None else tuple(array.shape)


def dtype(value: ir.Value | None) -> int | None:
    if value is None:
        return None
    if value.dtype is not None:
        return int(value.dtype)
    return None if value.const_value is None else int(value.const_value.dtype)


def np_dtype(value: ir.Value | None) -> Any:
    return onnx.helper.tensor_dtype_to_np_dtype(dtype(value))  # type: ignore[arg-type]


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    """An attribute's value (strings as str, lists as lists), or ``default``."""
    found = node.attributes.get(name)
    if found is None:
        return default
    value = found.value
    return list(value) if isinstance(value, tuple) else value


def input_(node: ir.Node, k: int) -> ir.Value | None:
    """Input ``k``, or None where the node has fewer inputs or leaves it out."""
    return node.inputs[k] if k < len(node.inputs) else None


def attributes(node: ir.Node, *drop: str) -> dict[str, ir.Attr]:
    return {name: a for name, a in node.attributes.items() if name not in drop}


def through_dtype(op: Any, node: ir.Node, to: int, back: int) -> Any:
    """``node`` computed on its first input cast to ``to``, its output cast back to ``back``."""
    x = op.Cast(node.inputs[0], to=to)
    inner = getattr(op, node.op_type)(x, *node.inputs[1:], **attributes(node))
    return op.Cast(inner, to=back)
