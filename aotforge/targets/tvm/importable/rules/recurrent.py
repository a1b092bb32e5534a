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

from aotforge.targets.tvm.importable.rules.base import Graph, attr, make

#: More steps than this stay a recurrent op: the unrolled graph grows per step.
MAX_STEPS = 512
#: Per op: the gate count and the default activations (f, g, h).
GATES = {"RNN": (1, ["Tanh"]), "GRU": (3, ["Sigmoid", "Tanh"]), "LSTM": (4, ["Sigmoid", "Tanh", "Tanh"])}
PLAIN = ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus")


@dataclasses.dataclass
class _Steps:
    """What one unrolled direction needs: the graph, the nodes so far, the constants by value."""

    g: Graph
    node: onnx.NodeProto
    dtype: Any
    nodes: list[onnx.NodeProto]

    def const(self, base: str, value: np.ndarray) -> str:
        name, const = self.g.constant(f"{self.node.output[1] or self.node.name}_{base}", value)
        self.nodes.append(const)
        return name

    def op(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self.g.fresh(f"{self.node.name or self.node.op_type}_{op.lower()}")
        self.nodes.append(make(op, inputs, [out], **attrs))
        return out

    def gate(self, x: str, k: int, hidden: int, axis: int = 1) -> str:
        begin, end = self.const("b", np.array([k * hidden], np.int64)), self.const("e", np.array([(k + 1) * hidden]))
        return self.op("Slice", [x, begin, end, self.const("axis", np.array([axis], np.int64))])

    def act(self, name: str, x: str, clip: float | None) -> str:
        if clip is not None:
            x = self.op(
                "Clip", [x, self.const("lo", np.array(-clip, self.dtype)), self.const("hi", np.array(clip, self.dtype))]
            )
        return self.op(name, [x])


def recurrent(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """RNN / GRU / LSTM unrolled over its static sequence (see the module's docstring)."""
    if node.op_type not in GATES or node.domain not in ("", "ai.onnx"):
        return None
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x_shape, w, r = g.shapes.get(inputs[0]), g.constants.get(inputs[1]), g.constants.get(inputs[2])
    bias = g.constants.get(inputs[3]) if inputs[3] else None
    peep = g.constants.get(inputs[7]) if node.op_type == "LSTM" and inputs[7] else None
    gates, default = GATES[node.op_type]
    activations = [a.decode() if isinstance(a, bytes) else a for a in attr(node, "activations", [])]
    if (
        x_shape is None or w is None or r is None or inputs[0] not in g.dtypes
        or (inputs[3] and bias is None)
        or attr(node, "activation_alpha") or attr(node, "activation_beta")
        or any(a not in PLAIN for a in activations)
    ):  # fmt: skip
        return None
    layout = int(attr(node, "layout", 0))
    steps, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    direction = attr(node, "direction", b"forward").decode()
    directions, hidden = w.shape[0], r.shape[-1]
    lens = g.constants.get(inputs[4]) if inputs[4] else None
    masked = bool(inputs[4]) and not (lens is not None and (lens == steps).all())
    if not 0 < steps <= MAX_STEPS or (masked and direction != "forward"):
        return None
    s = _Steps(g, node, g.np_dtype(inputs[0]), [])
    x = s.op("Transpose", [inputs[0]], perm=[1, 0, 2]) if layout else inputs[0]
    per_dir = len(default)
    hs, cs, ys = [], [], []
    for d in range(directions):
        acts = activations[d * per_dir : (d + 1) * per_dir] or default
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        b = bias[d] if bias is not None else np.zeros(2 * gates * hidden, s.dtype)
        p = _peepholes(s, inputs[7], peep, d) if node.op_type == "LSTM" and inputs[7] else None
        h0 = _initial(s, inputs[5], d, layout, batch, hidden)
        c0 = _initial(s, inputs[6], d, layout, batch, hidden) if node.op_type == "LSTM" else ""
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        h, c, per_step = _direction(s, x, w[d], r[d], b, p, acts, (h0, c0), order, inputs[4] if masked else "")
        hs.append(h)
        cs.append(c)
        ys.append(per_step)
    _outputs(s, hs, cs, ys, layout, steps)
    return s.nodes


def _peepholes(s: _Steps, given: str, value: np.ndarray | None, d: int) -> np.ndarray | str:
    """Direction ``d``'s peepholes [3 * hidden]: a constant, else gathered in the graph."""
    if value is not None:
        return value[d]
    return s.op("Gather", [given, s.const("dir", np.array(d, np.int64))], axis=0)


def _initial(s: _Steps, given: str, d: int, layout: int, batch: int, hidden: int) -> str:
    if not given:
        return s.const("zeros", np.zeros((batch, hidden), s.dtype))
    return s.op("Gather", [given, s.const("dir", np.array(d, np.int64))], axis=1 if layout else 0)


def _direction(
    s: _Steps, x: str, w: np.ndarray, r: np.ndarray, b: np.ndarray, p: np.ndarray | str | None,
    acts: list[str], state: tuple[str, str], order: range, lens: str,
) -> tuple[str, str, dict[int, str]]:  # fmt: skip
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
    lens = s.op("Cast", [lens], to=onnx.TensorProto.INT64) if lens else ""
    h, c = state
    per_step = {}
    for t in order:
        xt = s.op("Gather", [xw, s.const("t", np.array(t, np.int64))], axis=0)
        hr = s.op("MatMul", [h, rt])
        pre = s.op("Add", [s.op("Add", [xt, hr]), bias]) if op != "GRU" else ""
        if op == "RNN":
            new_h, new_c = s.act(acts[0], pre, clip), ""
        elif op == "GRU":
            new_h, new_c = _gru(s, xt, hr, h, rh, bias, wbh, rbh, acts, clip, hidden), ""
        else:
            new_h, new_c = _lstm(s, pre, c, p, acts, clip, hidden)
        if lens:
            keep = s.op(
                "Unsqueeze",
                [s.op("Less", [s.const("ti", np.array(t, np.int64)), lens]), s.const("ax", np.array([1], np.int64))],
            )
            zeros = s.const("zero", np.array(0, s.dtype))
            per_step[t] = s.op("Where", [keep, new_h, zeros])
            new_h = s.op("Where", [keep, new_h, h])
            new_c = s.op("Where", [keep, new_c, c]) if new_c else ""
        else:
            per_step[t] = new_h
        h, c = new_h, new_c
    return h, c, per_step


def _gru(
    s: _Steps, xt: str, hr: str, h: str, rh: str, bias: str, wbh: str, rbh: str,
    acts: list[str], clip: float | None, hidden: int,
) -> str:  # fmt: skip
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


def _lstm(
    s: _Steps, pre: str, c: str, p: np.ndarray | str | None, acts: list[str], clip: float | None, hidden: int
) -> tuple[str, str]:
    def peephole(gate: str, k: int, cell: str) -> str:
        if p is None:
            return gate
        weights = s.gate(p, k, hidden, axis=0) if isinstance(p, str) else s.const("p", p[k * hidden : (k + 1) * hidden])
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


def _outputs(s: _Steps, hs: list[str], cs: list[str], ys: list[dict[int, str]], layout: int, steps: int) -> None:
    """Y [T, D, B, H] (layout 1: [B, T, D, H]), Y_h and Y_c [D, B, H] (layout 1: [B, D, H])."""
    outs = list(s.node.output) + [""] * (3 - len(s.node.output))
    axis0, axes01 = s.const("ax0", np.array([0], np.int64)), s.const("ax01", np.array([0, 1], np.int64))
    if outs[0]:
        rows = [s.op("Concat", [s.op("Unsqueeze", [y[t], axes01]) for y in ys], axis=1) for t in range(steps)]
        y = s.op("Concat", rows, axis=0)
        s.nodes.append(
            make("Transpose", [y], [outs[0]], perm=[2, 0, 1, 3]) if layout else make("Identity", [y], [outs[0]])
        )
    for states, out in ((hs, outs[1]), (cs, outs[2])):
        if out and all(states):
            stacked = s.op("Concat", [s.op("Unsqueeze", [h, axis0]) for h in states], axis=0)
            s.nodes.append(
                make("Transpose", [stacked], [out], perm=[1, 0, 2]) if layout else make("Identity", [stacked], [out])
            )
