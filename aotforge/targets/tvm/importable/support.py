"""What TVM's Relax ONNX importer takes: its converter table, and the ops it has but gets wrong."""

from __future__ import annotations

import functools

import onnx_ir as ir

#: Ops the importer converts but not as ONNX defines them (found by the ONNX node suite), so their
#: function bodies are imported instead: op -> why.
EXPAND_ALWAYS = {
    "Attention": "the importer reads a 'num_heads' attribute Attention-23 does not have",
    "RotaryEmbedding": "not in the importer",
    "RMSNormalization": "the importer ignores stash_type / axis",
    "SoftmaxCrossEntropyLoss": "not in the importer",
    "NegativeLogLikelihoodLoss": "not in the importer",
}


@functools.cache
def importer_ops() -> frozenset[str]:
    """The ONNX ops the installed TVM importer has a converter for."""
    from tvm.relax.frontend.onnx import onnx_frontend

    # If is converted by the graph walk itself (its ``directly_handled_ops``), not through the table.
    return frozenset(onnx_frontend._get_convert_map()) | {"If"}


def wants_expansion(node: ir.Node) -> bool:
    """Expand ``node`` into its function body if the importer lacks it or gets it wrong."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "LayerNormalization":  # the importer gives Mean / InvStdDev the wrong shapes
        return len([o for o in node.outputs if o.name]) > 1
    if node.op_type in ("SpaceToDepth", "DepthToSpace"):  # the importer ignores mode=CRD on SpaceToDepth
        mode = node.attributes.get("mode")
        return node.op_type == "SpaceToDepth" and mode is not None and mode.value == "CRD"
    return node.op_type in EXPAND_ALWAYS or node.op_type not in importer_ops()
