"""The ``onnxruntime`` backend: everything of ONNX Runtime, its text-generation path included.

``target`` (the Target, its options, runner and session settings), ``session_io`` (sessions fed and read
with ``ml_dtypes`` arrays), ``decoder`` (the generative backend: compile, load, the step engine over two
sessions), ``decoder_fusions`` (the contrib-op rewrites of the exported decoder graphs),
``slot_attention`` (the torch op the decoder export writes as GroupQueryAttention).
"""

from __future__ import annotations

from aotforge.targets.onnxruntime.target import (
    OrtOptions,
    OrtRunner,
    OrtTarget,
    reference_session,
    session_options,
    stored_options,
)

__all__ = ["OrtOptions", "OrtRunner", "OrtTarget", "reference_session", "session_options", "stored_options"]
