"""A tensor-parallel rank graph as TensorRT's ONNX parser takes it: each all-reduce an ``Identity`` it parses, which
the builder then feeds from a ``DistCollective`` layer (``sdk.build_engine``).

A rank graph's all-reduce is one ``ai.onnx.contrib::AllReduce`` node (``compiler/generative/collectives.py``), which
the parser has no importer for. TensorRT's own collective, ``IDistCollectiveLayer`` (TensorRT 10.16 and 11: NCCL
inside the engine, ``INetworkDefinition.add_dist_collective``), is a network layer with no ONNX operator, so the
node becomes an ``Identity`` of a name of ours; the parser adds an identity layer of the node's name
(onnx-tensorrt's ``Identity`` importer: ``addIdentity``, ``registerLayer(layer, getNodeName(node))``), and the builder
puts the collective in front of it. Plain ONNX: this runs, and is tested, without TensorRT.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from aotforge.core.errors import CompileError

#: The rank graphs' collectives (``compiler/generative/collectives.py``, which imports torch: not imported here).
DOMAIN, OP_TYPE, REDUCE_SCATTER_OP, ALL_GATHER_OP = "ai.onnx.contrib", "AllReduce", "ReduceScatter", "AllGather"

#: What the parsed graph's file is called beside the rank's graph (its external weights resolve from that folder).
MARKED_SUFFIX = ".trt.onnx"
#: The marked nodes' names: this prefix and their index in the graph's all-reduces.
MARK = "aotforge_all_reduce_"


def mark_all_reduces(model: onnx.ModelProto) -> list[str]:
    """Rewrite ``model``'s all-reduces to ``Identity`` nodes named ``MARK<i>`` in place; their names, in graph order."""
    names: list[str] = []
    for node in model.graph.node:
        if node.domain != DOMAIN:
            continue
        if node.op_type in (REDUCE_SCATTER_OP, ALL_GATHER_OP):
            raise CompileError(
                f"tensorrt rank graphs run all-reduces only, not a sequence-parallel prefill's {node.op_type}: "
                "build without --sequence-parallel"
            )
        if node.op_type != OP_TYPE:
            raise CompileError(f"tensorrt cannot run the rank graph's {node.domain}::{node.op_type} node")
        node.op_type, node.domain, node.name = "Identity", "", f"{MARK}{len(names)}"
        del node.attribute[:]
        names.append(node.name)
    kept = [op for op in model.opset_import if op.domain != DOMAIN]  # no node of the domain is left
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return names


def marked_graph(graph: Path) -> tuple[Path, list[str]]:
    """``graph`` with its all-reduces marked, written beside it (``MARKED_SUFFIX``: the caller removes it), and the
    marked nodes' names."""
    model = onnx.load(str(graph), load_external_data=False)
    names = mark_all_reduces(model)
    out = graph.with_name(graph.name.removesuffix(".onnx") + MARKED_SUFFIX)
    onnx.save(model, str(out))
    return out, names
