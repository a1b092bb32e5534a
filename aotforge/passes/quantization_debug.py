"""Quantization debugging: output cosine against fp32 and a ranking of quantized nodes by the error they add.

Both models run on ONNX Runtime's CPU provider. A node's added error is the cosine drop
(``1 - cos``) of its output between the fp32 and the quantized model, less the worst drop
among its activation inputs, so error inherited from upstream is not charged to it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from aotforge.core.runtime_threads import environment_threads

Feeds = dict[str, np.ndarray]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays flattened; 1.0 when both are zero."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y) / norm if norm > 0 else float(np.array_equal(x, y))


def copy_model(model: ir.Model) -> ir.Model:
    """A deep copy of ``model`` (weights loaded into memory)."""
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def _session(model: ir.Model, probes: dict[str, int] | None = None) -> ort.InferenceSession:
    proto = ir.serde.serialize_model(model)
    present = {o for n in proto.graph.node for o in n.output} | {o.name for o in proto.graph.output}
    known = {o.name for o in proto.graph.output}
    for name, elem_type in (probes or {}).items():
        if name in present and name not in known:
            proto.graph.output.append(onnx.helper.make_tensor_value_info(name, elem_type, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = environment_threads()
    options.log_severity_level = 3
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL if probes else options.graph_optimization_level
    )
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def mean_cosine(fp32: ir.Model, quantized: ir.Model, feeds: list[Feeds]) -> float:
    """Mean over samples and graph outputs of the cosine between the two models' outputs."""
    ref, got = _session(fp32), _session(quantized)
    values = [cosine(a, b) for f in feeds for a, b in zip(ref.run(None, f), got.run(None, f), strict=True)]
    return float(np.mean(values))


def tensor_values(model: ir.Model, values: list[ir.Value], feeds: list[Feeds]) -> Iterator[dict[str, np.ndarray]]:
    """The arrays ``values`` (inputs or intermediate tensors of ``model``) take, one dict per feed, in order."""
    fed = {str(v.name) for v in model.graph.inputs}
    # Untyped values (no shape inference ran) are taken as float: activations and attention biases are.
    probes = {str(v.name): int(v.dtype or ir.DataType.FLOAT) for v in values if str(v.name) not in fed}
    names = list(probes)
    sess = _session(model, probes) if names else None
    for feed in feeds:
        got = dict(zip(names, sess.run(names, feed), strict=True)) if sess is not None else {}
        yield {**got, **{k: v for k, v in feed.items() if k in {str(x.name) for x in values}}}


def sample_cosines(fp32: ir.Model, quantized: ir.Model, feeds: list[Feeds]) -> list[float]:
    """Per feed, the least cosine over graph outputs between the two models (e.g. one per sentence)."""
    ref, got = _session(fp32), _session(quantized)
    return [min(cosine(a, b) for a, b in zip(ref.run(None, f), got.run(None, f), strict=True)) for f in feeds]


def _probes(fp32: ir.Model, nodes: list[ir.Node]) -> dict[str, int]:
    """Typed activation tensors (inputs and outputs of ``nodes``) to expose as extra outputs."""
    probes = {}
    for node in nodes:
        for value in [*node.inputs, *node.outputs]:
            if value is None or value.name is None or value.dtype is None or value.is_initializer():
                continue
            if value.producer() is not None:
                probes[value.name] = int(value.dtype)
    return probes


def _producers(model: ir.Model) -> dict[str, ir.Node]:
    return {str(v.name): n for n in model.graph for v in n.outputs}


def _dequantized_views(model: ir.Model) -> dict[str, str]:
    """tensor -> the DequantizeLinear(QuantizeLinear(tensor)) output its QDQ consumers read."""
    views = {}
    for node in model.graph:
        if node.op_type != "QuantizeLinear" or node.inputs[0] is None:
            continue
        for use in node.outputs[0].uses():
            if use.node.op_type == "DequantizeLinear":
                views[str(node.inputs[0].name)] = str(use.node.outputs[0].name)
    return views


def _counterparts(fp32: ir.Model, quantized: ir.Model, names: list[str]) -> dict[str, str]:
    """fp32 tensor -> the quantized graph's tensor that stands for it, where there is one.

    That is the tensor itself where the quantized graph computes it as fp32 does (same producer op,
    or a node the quantizer named after the producer: dynamic MatMul -> ``<name>_quant...``), read
    through its Q/DQ pair where it has one (what consumers see). A Relu / Clip the QDQ quantizer
    folded leaves its output name on the node before; its Q/DQ pair clamps as the activation did.
    """
    before, after, views = _producers(fp32), _producers(quantized), _dequantized_views(quantized)
    out = {}
    for name in names:
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            continue
        same = new.op_type in (old.op_type, "DequantizeLinear") or str(new.name).startswith(f"{old.name}_")
        if same or (old.op_type in ("Relu", "Clip") and name in views):
            out[name] = views.get(name, name)
    return out


def _drops(fp32: ir.Model, quantized: ir.Model, probes: dict[str, int], feeds: list[Feeds]) -> dict[str, float]:
    """Mean ``1 - cos`` of each probed fp32 tensor against its quantized counterpart."""
    pairs = _counterparts(fp32, quantized, list(probes))
    ref = _session(fp32, {name: probes[name] for name in pairs})
    got = _session(quantized, {view: probes[name] for name, view in pairs.items()})
    present = {o.name for o in ref.get_outputs()} & set(pairs)
    names = sorted(n for n in present if pairs[n] in {o.name for o in got.get_outputs()})
    drops: dict[str, list[float]] = {name: [] for name in names}
    for f in feeds:
        for name, a, b in zip(names, ref.run(names, f), got.run([pairs[n] for n in names], f), strict=True):
            drops[name].append(1.0 - cosine(a, b))
    return {name: float(np.mean(d)) for name, d in drops.items()}


def rank_nodes(fp32: ir.Model, quantized: ir.Model, feeds: list[Feeds], names: list[str]) -> list[tuple[str, float]]:
    """The fp32 nodes named in ``names``, worst added error first, as (name, error)."""
    nodes = [n for n in fp32.graph if n.name in set(names)]
    drops = _drops(fp32, quantized, _probes(fp32, nodes), feeds)
    ranking = []
    for node in nodes:
        out = max((drops.get(str(v.name), 0.0) for v in node.outputs), default=0.0)
        inherited = max((drops.get(str(v.name), 0.0) for v in node.inputs if v is not None), default=0.0)
        ranking.append((str(node.name), round(max(out - inherited, 0.0), 6), out))
    ranking.sort(key=lambda item: (-item[1], -item[2]))
    return [(name, added) for name, added, _ in ranking]
