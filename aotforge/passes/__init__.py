"""Graph passes over the IR and the named presets that order them.

Passes are looked up by name in :data:`PASSES` (a table of dotted paths, imported on use);
presets are lists of those names in :data:`PRESETS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aotforge.core.errors import OptionsError

if TYPE_CHECKING:  # only named: the table and presets stay importable without onnx_ir (a direct cache hit)
    from aotforge.passes.base import GraphPass

PASSES: dict[str, str] = {
    "fold": "aotforge.passes.fold_constants:FoldConstantsPass",
    "dce": "aotforge.passes.eliminate_dead_code:EliminateDeadCodePass",
    "cse": "aotforge.passes.eliminate_common_subexpressions:EliminateCommonSubexpressionsPass",
    "optimize": "aotforge.passes.optimize_graph:OptimizeGraphPass",
    "fuse-conv-bn": "aotforge.passes.fuse_conv_batchnorm:FuseConvBatchNormPass",
    "fuse": "aotforge.passes.fuse_patterns:FusePatternsPass",
    "fuse-ort": "aotforge.passes.fuse_patterns:FuseOrtPass",
    "fp16": "aotforge.passes.convert_precision:ConvertToFloat16Pass",
    "bf16": "aotforge.passes.convert_precision:ConvertToBFloat16Pass",
    "int8-dynamic": "aotforge.passes.quantize_dynamic:QuantizeDynamicPass",
    "int8": "aotforge.passes.quantize_static:QuantizeStaticPass",
    "weight-only": "aotforge.passes.quantize_weight_only:QuantizeWeightOnlyPass",
    "sparsity24": "aotforge.passes.prune_structured:PruneStructuredPass",
    "prune": "aotforge.passes.prune_magnitude:PruneMagnitudePass",
}

PRESETS: dict[str, tuple[str, ...]] = {
    "O0": (),
    "O1": ("fold", "dce"),
    # fuse-conv-bn and fuse emit standard ONNX only, so O2 holds for every target; fuse-ort does not.
    "O2": ("optimize", "fuse-conv-bn", "fuse", "cse", "dce"),
}

DEFAULT_PRESET = "O1"

#: Passes whose output holds com.microsoft contrib ops only ONNX Runtime runs.
CONTRIB_OP_PASSES: frozenset[str] = frozenset({"fuse-ort", "weight-only"})


def contrib_op_passes(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The passes of ``names`` that emit contrib ops; targets learn it from the build context."""
    return tuple(n for n in names if n in CONTRIB_OP_PASSES)


def pass_class(name: str) -> type[GraphPass]:
    try:
        dotted = PASSES[name]
    except KeyError:
        raise OptionsError(
            f"unknown pass {name!r}; passes: {', '.join(PASSES)}; presets: {', '.join(PRESETS)}"
        ) from None
    module_name, _, cls_name = dotted.partition(":")
    cls: type[GraphPass] = getattr(importlib.import_module(module_name), cls_name)
    return cls


def expand(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Expand presets in a list of pass names, keeping order (``O1,int8`` -> ``fold,dce,int8``)."""
    out: list[str] = []
    for name in names:
        out.extend(PRESETS.get(name, (name,)))
    for name in out:
        pass_class(name)
    return tuple(out)


def make_pass(name: str, params: Mapping[str, Any] | None = None) -> GraphPass:
    """Instantiate pass ``name`` with parameters from loose values (unknown keys rejected)."""
    from aotforge.core.options import options_from_dict

    cls = pass_class(name)
    return cls(options_from_dict(cls.Params, params or {}, what=f"pass {name}"))
