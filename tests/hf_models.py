"""Small transformers models (random weights, 2 layers, hidden 64) saved as a user's model directory.

Each entry builds a config, instantiates the task's model class, ``save_pretrained``s it and,
for text models, a word-level tokenizer stand-in (``PreTrainedTokenizerFast``); image models
whose config has no ``image_size`` get a ``preprocessor_config.json`` giving one. Nothing is
downloaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB = 128
TEXT = dict(vocab_size=VOCAB, max_position_embeddings=64)


@dataclasses.dataclass(frozen=True)
class HFModel:
    """One row of the supported-architectures table."""

    model_class: str
    task: str
    config: Callable[[], Any]
    text: bool = True
    preprocessor: dict[str, Any] | None = None


def _bert() -> Any:
    from transformers import BertConfig

    return BertConfig(**TEXT, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)


def _distilbert() -> Any:
    from transformers import DistilBertConfig

    return DistilBertConfig(**TEXT, dim=64, n_layers=2, n_heads=2, hidden_dim=128, num_labels=3)


def _roberta() -> Any:
    from transformers import RobertaConfig

    # Positions start after padding_idx (1): 64 tokens need 66 position embeddings.
    return RobertaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=66,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
    )


def _gpt2() -> Any:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)


def _t5() -> Any:
    from transformers import T5Config

    return T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0
    )


def _whisper() -> Any:
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        max_source_positions=32,
        max_target_positions=32,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )


def _vit() -> Any:
    from transformers import ViTConfig

    return ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        num_labels=5,
    )


def _convnext() -> Any:
    from transformers import ConvNextConfig

    return ConvNextConfig(image_size=32, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5)


def _resnet() -> Any:
    from transformers import ResNetConfig

    return ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=5)


def _mobilenet_v2() -> Any:
    from transformers import MobileNetV2Config

    return MobileNetV2Config(image_size=64, depth_multiplier=0.35, num_labels=5, initializer_range=0.2)


ARCHITECTURES: dict[str, HFModel] = {
    "bert": HFModel("BertModel", "feature-extraction", _bert),
    "bert-mlm": HFModel("BertForMaskedLM", "fill-mask", _bert),
    "distilbert": HFModel("DistilBertForSequenceClassification", "text-classification", _distilbert),
    "roberta": HFModel("RobertaForMaskedLM", "fill-mask", _roberta),
    "gpt2": HFModel("GPT2Model", "feature-extraction", _gpt2),
    "t5-encoder": HFModel("T5Model", "feature-extraction", _t5),
    "whisper-encoder": HFModel("WhisperModel", "feature-extraction", _whisper, text=False),
    "vit": HFModel("ViTForImageClassification", "image-classification", _vit, text=False),
    "convnext": HFModel("ConvNextForImageClassification", "image-classification", _convnext, text=False),
    "resnet": HFModel(
        "ResNetForImageClassification",
        "image-classification",
        _resnet,
        text=False,
        preprocessor={
            "image_processor_type": "ViTImageProcessor",
            "size": {"height": 48, "width": 48},
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    ),
    "mobilenet_v2": HFModel("MobileNetV2ForImageClassification", "image-classification", _mobilenet_v2, text=False),
}


def save_model(name: str, root: Path, seed: int = 0) -> Path:
    """``root / name``: the model's weights, config and (text) tokenizer, as ``save_pretrained`` writes them."""
    import torch
    import transformers

    spec = ARCHITECTURES[name]
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_class)(spec.config())
    path = root / name
    model.save_pretrained(path)
    if spec.text:
        _tokenizer().save_pretrained(path)
    if spec.preprocessor is not None:
        (path / "preprocessor_config.json").write_text(json.dumps(spec.preprocessor))
    return path


def _tokenizer() -> Any:
    """A word-level tokenizer over the first VOCAB words of a stdlib docstring (real English), [UNK] for the rest."""
    import textwrap

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = dict.fromkeys(w.lower() for w in textwrap.__doc__.split() if w.isalpha())  # type: ignore[union-attr]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate([*specials, *words][:VOCAB])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        # As a BERT tokenizer; a model without segments ignores token_type_ids.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
