"""Graph passes over the IR and the named presets that order them.

Passes are looked up by name in :data:`PASSES` (a table of dotted paths, imported on use);
presets are lists of those names in :data:`PRESETS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from compiler.errors import OptionsError
from passes.base import GraphPass

PASSES: dict[str, str] = {
    "fold": "passes.fold_constants:FoldConstantsPass",
    "dce": "passes.eliminate_dead_code:EliminateDeadCodePass",
    "cse": "passes.eliminate_common_subexpressions:EliminateCommonSubexpressionsPass",
    "optimize": "passes.optimize_graph:OptimizeGraphPass",
    "fuse-conv-bn": "passes.fuse_conv_batchnorm:FuseConvBatchNormPass",
    "fuse": "passes.fuse_patterns:FusePatternsPass",
    "fuse-ort": "passes.fuse_patterns:FuseOrtPass",
    "fp16": "passes.convert_precision:ConvertToFloat16Pass",
    "bf16": "passes.convert_precision:ConvertToBFloat16Pass",
    "int8-dynamic": "passes.quantize_dynamic:QuantizeDynamicPass",
    "int8": "passes.quantize_static:QuantizeStaticPass",
    "weight-only": "passes.quantize_weight_only:QuantizeWeightOnlyPass",
    "sparsity24": "passes.prune_structured:PruneStructuredPass",
    "prune": "passes.prune_magnitude:PruneMagnitudePass",
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
    from targets.base import options_from_dict

    cls = pass_class(name)
    return cls(options_from_dict(cls.Params, params or {}, what=f"pass {name}"))
