"""What a target's text-generation path gives the build line: one typed record per backend module.

Each module the target registry names (``aotforge.targets.GENERATIVE``) ends with
``BACKEND = GenerativeBackend(...)``, so mypy checks its hooks against the signatures the build line calls,
and the build reads fields instead of probing the module with ``getattr`` and a default. A hook a backend
does not have is ``None``; a capability it lacks keeps the field's default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aotforge.core.decoder import WEIGHTS_FILE, DecoderSpec
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult

#: ``(graphs by file name, spec) -> counts by rewrite``: a backend's own rewrites of the exported ONNX graphs
GraphRewrite = Callable[[dict[str, Any], DecoderSpec], dict[str, dict[str, int]]]


@dataclasses.dataclass(frozen=True)
class GenerativeBackend:
    """A target's compile and load of the prefill / decode (/ verify) graphs, and what its build path takes."""

    #: ``(workdir, spec, target options, say, **extra) -> CompileResult`` over the staged graphs; ``extra`` is
    #: ``verify_width`` (``speculative``), ``passes`` (``compile_passes``) or a bundle's ``modules``
    compile: Callable[..., CompileResult]
    #: ``(artifact dir, target record) -> runner`` with ``generate`` / ``stream``
    load: Callable[[Path, TargetRecord], Any]
    #: the decode graph's attention the export writes (``compiler.generative.export.DECODE_ATTENTION``)
    decode_attention: str = "masked"
    #: ``(causal LM, spec) -> why`` its ``decode_attention`` cannot run this model ('' when it can): the build
    #: then exports ``"masked"`` attention (standard ops) and records the reason
    decode_attention_refusal: Callable[[Any, DecoderSpec], str] | None = None
    #: compiles a verify graph (``--speculative-k``): ``compile(..., verify_width=)``
    speculative: bool = False
    #: refuses, before the export, target options this path cannot honour
    plan: Callable[[DecoderSpec, Any], object] | None = None
    #: rewrites of the exported graphs before the passes, and after them
    prepare_graphs: GraphRewrite | None = None
    rewrite_graphs: GraphRewrite | None = None
    #: passes the backend applies itself while compiling (not to the ONNX graphs): ``compile(..., passes=)``,
    #: and its refusal, before the export, of their parameters it cannot honour
    compile_passes: frozenset[str] = frozenset()
    check_compile_passes: Callable[[dict[str, Any]], None] | None = None
    #: pass parameters of text-generation builds, under the user's (a decode step is not an encoder's batch)
    pass_defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    #: target options of text-generation builds, under the user's (onnxruntime: the thread pool's short spin)
    target_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: the artifact file its runner reads the weights from, which the manifest's ``target.info.weights`` names:
    #: the export's ``weights.data``, or what ``compile`` stores in its place (tvm: ``tvm_weights.data``)
    weights_file: str = WEIGHTS_FILE
    #: device targets, built through a bundle: the plan the bundle carries, and what it holds for the device
    #: host ("onnx": the graphs over their weights; "torch": the causal LM's weights)
    bundle_plan: Callable[[DecoderSpec, Any], dict[str, Any]] | None = None
    graphs_from: str = ""
    #: finishes another target's bundle of ONNX graphs (``graphs_from="onnx"``), running them as they are
    finishes_onnx_bundles: bool = False
