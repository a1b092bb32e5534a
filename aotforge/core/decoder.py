"""What a generative (text-generation) artifact's runtime must know: the decoder's cache geometry.

Shared by the exporter (``compiler.generative``) and every target's generative engine
(``targets.generative``), so it lives at the bottom layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from aotforge.core.spec import DimRange, IOSpec, TensorSpec

#: The task name a generative artifact records (``target.info["task"]``).
TEXT_GENERATION = "text-generation"
PREFILL_FILE = "prefill.onnx"
DECODE_FILE = "decode.onnx"
WEIGHTS_FILE = "weights.data"
#: Tokenizer files a generative artifact carries when its model directory has them (``generate --prompt``);
#: a draft artifact must carry the same ones as its target.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    # The chat template (transformers 5 writes it beside the tokenizer): what a served chat request needs.
    "chat_template.jinja",
)
#: The model's generation defaults (its end-of-sequence ids: where the runtime stops by default), carried too.
GENERATION_CONFIG_FILE = "generation_config.json"
#: A draft whose vocabulary is a subset of its target's (``aotforge distill --draft-vocab``): the target's token id
#: of each of the draft's (``targets/generative/draft_vocab.py``), carried too.
DRAFT_VOCAB_FILE = "draft_vocab.json"
CARRIED_FILES = (*TOKENIZER_FILES, GENERATION_CONFIG_FILE, DRAFT_VOCAB_FILE)
#: The speculative-decoding verify graph (``--speculative-k``): k+1 query tokens per slot -> logits of each.
VERIFY_FILE = "verify.onnx"
#: What a decoder graph computes per call: a prompt's many rows (prefill, verify) or a decode step's few. A pass
#: may run with other parameters on each (``GraphPass.for_graph``), since the kernels that win differ.
GraphRole = Literal["prompt", "decode"]
#: Each decoder graph's role for the passes (``GraphPass.for_graph``): how many rows its matmuls see a call.
GRAPH_ROLES: dict[str, GraphRole] = {PREFILL_FILE: "prompt", VERIFY_FILE: "prompt", DECODE_FILE: "decode"}


def sliding_windows(config: Any, max_seq_len: int | None) -> dict[str, int]:
    """The window of each layer type that slides over fewer positions than ``max_seq_len`` (``None``: any window),
    by ``layer_types``' name, ``""`` for a family without layer types whose every layer slides (Mistral, Phi-3);
    ``{}`` when every layer attends over the whole cache."""
    window = getattr(config, "sliding_window", None)
    if not window or (max_seq_len is not None and int(window) >= max_seq_len):
        return {}
    types = getattr(config, "layer_types", None)
    if types is None:
        return {"": int(window)}
    return {"sliding_attention": int(window)} if "sliding_attention" in types else {}


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    """Per-layer KV cache of ``[batch, kv_heads, max_seq_len, head_dim]`` float32, one slot per sequence."""

    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_seq_len: int
    max_batch: int

    def kv_names(self, prefix: str) -> list[str]:
        """``past`` (decode inputs) or ``present`` (outputs) names, key then value per layer."""
        return [f"{prefix}_{kind}_{i}" for i in range(self.layers) for kind in ("key", "value")]

    def kv_cache_bytes(self, batch: int) -> int:
        return 2 * self.layers * batch * self.kv_heads * self.max_seq_len * self.head_dim * 4

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecoderSpec:
        return cls(**{f.name: int(data[f.name]) for f in dataclasses.fields(cls)})


def prefill_io(spec: DecoderSpec) -> IOSpec:
    """What ``LoadedArtifact.run`` accepts: the prefill graph (``generate`` drives both graphs)."""
    ids = ("batch", "prompt")
    return IOSpec(
        inputs=(
            TensorSpec("input_ids", "int64", ids, (0.0, float(spec.vocab))),
            TensorSpec("attention_mask", "int64", ids, (1.0, 2.0)),
            TensorSpec("position_ids", "int64", ids),
        ),
        outputs=(TensorSpec("logits", "float32", ("batch", spec.vocab)),),
        dims=(DimRange("batch", 1, 1, spec.max_batch), DimRange("prompt", 1, 16, spec.max_seq_len)),
    )
