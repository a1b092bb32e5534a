"""RNN / GRU / LSTM with a static sequence length, unrolled into MatMul / Add / activation steps.

The importer has none of them at opset 22. Semantics as ONNX defines them (onnx's reference in
``onnx/reference/ops/op_{rnn,gru,lstm}.py`` computes the same for the suite's cases): gates in
the order of the weights (GRU z, r, h; LSTM i, o, f, c; peepholes i, o, f), ``direction``
forward / reverse / bidirectional, ``layout`` 0 (time-major) or 1 (batch-major), ``clip`` on the
gates' inputs, GRU ``linear_before_reset``, LSTM ``input_forget``, initial states, and
``sequence_lens`` (masked steps keep the state and give zeros; a reverse pass only with every
length the full one). Left alone (and so refused at planning): weights that are not constants,
activations with alpha / beta, and sequences longer than :data:`MAX_STEPS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    const,
    constant,
    dtype,
    input_,
    np_dtype,
    shape,
)

#: More steps than this stay a recurrent op: the unrolled graph grows per step.
MAX_STEPS = 512
#: Per op: the gate count and the default activations (f, g, h).
GATES = {"RNN": (1, ["Tanh"]), "GRU": (3, ["Sigmoid", "Tanh"]), "LSTM": (4, ["Sigmoid", "Tanh", "Tanh"])}
PLAIN = ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus")


@dataclasses.dataclass
class _Steps:
    """What one unrolled direction needs: the rewriter's op builder, the node and its element type."""

    builder: Any
    node: ir.Node
    dtype: Any

    def const(self, _base: str, value: np.ndarray) -> Any:
        return constant(self.builder, value)

    def op(self, op: str, inputs: list[Any], **attrs: Any) -> Any:
        return getattr(self.builder, op)(*inputs, **attrs)

    def gate(self, x: Any, k: int, hidden: int, axis: int = 1) -> Any:
        begin, end = self.const("b", np.array([k * hidden], np.int64)), self.const("e", np.array([(k + 1) * hidden]))
        return self.op("Slice", [x, begin, end, self.const("axis", np.array([axis], np.int64))])

    def act(self, name: str, x: Any, clip: float | None) -> Any:
        if clip is not None:
            x = self.op(
                "Clip", [x, self.const("lo", np.array(-clip, self.dtype)), self.const("hi", np.array(clip, self.dtype))]
            )
        return self.op(name, [x])


class Recurrent(NodeRule):
    """RNN / GRU / LSTM unrolled over its static sequence (see the module's docstring)."""

    report_name, ops = "recurrent", tuple(GATES)
    outputs = (1, 2, 3)

    def check_node(self, node: ir.Node) -> MatchResult:
        inputs = [input_(node, k) for k in range(8)]
        x_shape, w, r = shape(inputs[0]), const(inputs[1]), const(inputs[2])
        activations = attr(node, "activations", [])
        if (
            x_shape is None or w is None or r is None or dtype(inputs[0]) is None
            or (inputs[3] is not None and const(inputs[3]) is None)
            or attr(node, "activation_alpha") or attr(node, "activation_beta")
            or any(a not in PLAIN for a in activations)
        ):  # fmt: skip
            return MatchResult().fail("weights not constant, or activations with alpha / beta")
        steps = x_shape[1] if int(attr(node, "layout", 0)) else x_shape[0]
        lens = const(inputs[4])
        masked = inputs[4] is not None and not (lens is not None and (lens == steps).all())
        if not 0 < steps <= MAX_STEPS or (masked and attr(node, "direction", "forward") != "forward"):
            return MatchResult().fail(f"more than {MAX_STEPS} steps, or sequence_lens on a backward pass")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        inputs = [input_(node, k) for k in range(8)]
        x_shape, w, r = shape(inputs[0]), const(inputs[1]), const(inputs[2])
        assert x_shape is not None and w is not None and r is not None  # checked
        bias, peep = const(inputs[3]), const(inputs[7]) if node.op_type == "LSTM" else None
        gates, default = GATES[node.op_type]
        activations = attr(node, "activations", [])
        layout = int(attr(node, "layout", 0))
        steps, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
        direction = attr(node, "direction", "forward")
        directions, hidden = w.shape[0], r.shape[-1]
        lens = const(inputs[4])
        masked = inputs[4] is not None and not (lens is not None and (lens == steps).all())
        s = _Steps(op, node, np_dtype(inputs[0]))  # type: ignore[arg-type]
        x = s.op("Transpose", [inputs[0]], perm=[1, 0, 2]) if layout else inputs[0]
        per_dir = len(default)
        hs, cs, ys = [], [], []
        for d in range(directions):
            acts = activations[d * per_dir : (d + 1) * per_dir] or default
            reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
            b = bias[d] if bias is not None else np.zeros(2 * gates * hidden, s.dtype)
            p = _peepholes(s, inputs[7], peep, d) if node.op_type == "LSTM" and inputs[7] is not None else None
            h0 = _initial(s, inputs[5], d, layout, batch, hidden)
            c0 = _initial(s, inputs[6], d, layout, batch, hidden) if node.op_type == "LSTM" else None
            order = range(steps - 1, -1, -1) if reverse else range(steps)
            h, c, per_step = _direction(s, x, w[d], r[d], b, p, acts, (h0, c0), order, inputs[4] if masked else None)
            hs.append(h)
            cs.append(c)
            ys.append(per_step)
        return _outputs(s, hs, cs, ys, layout, steps)


def _peepholes(s: _Steps, given: Any, value: np.ndarray | None, d: int) -> Any:
    """Direction ``d``'s peepholes [3 * hidden]: a constant, else gathered in the graph."""
    if value is not None:
        return value[d]
    return s.op("Gather", [given, s.const("dir", np.array(d, np.int64))], axis=0)


def _initial(s: _Steps, given: Any, d: int, layout: int, batch: int, hidden: int) -> Any:
    if given is None:
        return s.const("zeros", np.zeros((batch, hidden), s.dtype))
    return s.op("Gather", [given, s.const("dir", np.array(d, np.int64))], axis=1 if layout else 0)


def _direction(
    s: _Steps, x: Any, w: np.ndarray, r: np.ndarray, b: np.ndarray, p: Any,
    acts: list[str], state: tuple[Any, Any], order: range, lens: Any,
) -> tuple[Any, Any, dict[int, Any]]:  # fmt: skip
    """The steps of one direction: the last H (and C), and each step's H by time index."""
    op, hidden = s.node.op_type, r.shape[-1]
    clip = attr(s.node, "clip")
    half = len(b) // 2
    wt, rt = s.const("wt", np.ascontiguousarray(w.T)), s.const("rt", np.ascontiguousarray(r.T))
    if op == "GRU":  # the candidate's recurrent part is its own product (it meets the reset gate first)
        rt = s.const("rt_zr", np.ascontiguousarray(r[: 2 * hidden].T))
        rh = s.const("rt_h", np.ascontiguousarray(r[2 * hidden :].T))
        bias = s.const("b_zr", (b[: 2 * hidden] + b[half : half + 2 * hidden]).astype(s.dtype))
        wbh, rbh = s.const("wb_h", b[2 * hidden : half]), s.const("rb_h", b[half + 2 * hidden :])
    else:
        bias = s.const("bias", (b[:half] + b[half:]).astype(s.dtype))
    # every step's input product at once: [T, B, gates * hidden]
    xw = s.op("MatMul", [x, wt])
    lens = s.op("Cast", [lens], to=onnx.TensorProto.INT64) if lens is not None else None
    h, c = state
    per_step = {}
    for t in order:
        xt = s.op("Gather", [xw, s.const("t", np.array(t, np.int64))], axis=0)
        hr = s.op("MatMul", [h, rt])
        pre = s.op("Add", [s.op("Add", [xt, hr]), bias]) if op != "GRU" else None
        if op == "RNN":
            new_h, new_c = s.act(acts[0], pre, clip), None
        elif op == "GRU":
            new_h, new_c = _gru(s, xt, hr, h, rh, bias, wbh, rbh, acts, clip, hidden), None
        else:
            new_h, new_c = _lstm(s, pre, c, p, acts, clip, hidden)
        if lens is not None:
            keep = s.op(
                "Unsqueeze",
                [s.op("Less", [s.const("ti", np.array(t, np.int64)), lens]), s.const("ax", np.array([1], np.int64))],
            )
            zeros = s.const("zero", np.array(0, s.dtype))
            per_step[t] = s.op("Where", [keep, new_h, zeros])
            new_h = s.op("Where", [keep, new_h, h])
            new_c = s.op("Where", [keep, new_c, c]) if new_c is not None else None
        else:
            per_step[t] = new_h
        h, c = new_h, new_c
    return h, c, per_step


def _gru(
    s: _Steps, xt: Any, hr: Any, h: Any, rh: Any, bias: Any, wbh: Any, rbh: Any,
    acts: list[str], clip: float | None, hidden: int,
) -> Any:  # fmt: skip
    zr = s.op("Add", [s.op("Add", [s.gate(xt, 0, 2 * hidden), hr]), bias])
    z, r = s.act(acts[0], s.gate(zr, 0, hidden), clip), s.act(acts[0], s.gate(zr, 1, hidden), clip)
    xh = s.op("Add", [s.gate(xt, 2, hidden), wbh])
    if attr(s.node, "linear_before_reset", 0):
        recur = s.op("Mul", [r, s.op("Add", [s.op("MatMul", [h, rh]), rbh])])
    else:
        recur = s.op("Add", [s.op("MatMul", [s.op("Mul", [r, h]), rh]), rbh])
    candidate = s.act(acts[1], s.op("Add", [xh, recur]), clip)
    one = s.const("one", np.array(1, s.dtype))
    return s.op("Add", [s.op("Mul", [s.op("Sub", [one, z]), candidate]), s.op("Mul", [z, h])])


def _lstm(s: _Steps, pre: Any, c: Any, p: Any, acts: list[str], clip: float | None, hidden: int) -> tuple[Any, Any]:
    def peephole(gate: Any, k: int, cell: Any) -> Any:
        if p is None:
            return gate
        if isinstance(p, np.ndarray):
            weights = s.const("p", p[k * hidden : (k + 1) * hidden])
        else:
            weights = s.gate(p, k, hidden, axis=0)
        return s.op("Add", [gate, s.op("Mul", [weights, cell])])

    i = s.act(acts[0], peephole(s.gate(pre, 0, hidden), 0, c), clip)
    if attr(s.node, "input_forget", 0):
        f = s.op("Sub", [s.const("one", np.array(1, s.dtype)), i])
    else:
        f = s.act(acts[0], peephole(s.gate(pre, 2, hidden), 2, c), clip)
    cell = s.act(acts[1], s.gate(pre, 3, hidden), clip)
    new_c = s.op("Add", [s.op("Mul", [f, c]), s.op("Mul", [i, cell])])
    o = s.act(acts[0], peephole(s.gate(pre, 1, hidden), 1, new_c), clip)
    return s.op("Mul", [o, s.op(acts[2], [new_c])]), new_c


def _outputs(s: _Steps, hs: list[Any], cs: list[Any], ys: list[dict[int, Any]], layout: int, steps: int) -> Any:
    """Y [T, D, B, H] (layout 1: [B, T, D, H]), Y_h and Y_c [D, B, H] (layout 1: [B, D, H]): one per output the node
    has, None where it leaves one out."""
    used = [bool(v.name) for v in s.node.outputs]
    axis0, axes01 = s.const("ax0", np.array([0], np.int64)), s.const("ax01", np.array([0, 1], np.int64))
    outputs: list[Any] = []
    if used[0]:
        rows = [s.op("Concat", [s.op("Unsqueeze", [y[t], axes01]) for y in ys], axis=1) for t in range(steps)]
        y = s.op("Concat", rows, axis=0)
        outputs.append(s.op("Transpose", [y], perm=[2, 0, 1, 3]) if layout else y)
    else:
        outputs.append(None)
    for k, states in ((1, hs), (2, cs)):
        if k < len(used):
            if used[k] and all(state is not None for state in states):
                stacked = s.op("Concat", [s.op("Unsqueeze", [h, axis0]) for h in states], axis=0)
                outputs.append(s.op("Transpose", [stacked], perm=[1, 0, 2]) if layout else stacked)
            else:
                outputs.append(None)
    return outputs if len(outputs) > 1 else outputs[0]
