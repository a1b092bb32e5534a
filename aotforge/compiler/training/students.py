"""The student a distillation starts from: the teacher cut to fewer layers (its embedding, norms, head and an
evenly spaced subset of its layers, first and last kept: a draft that already speaks the teacher's vocabulary and
layout, as DistilBERT's and most draft models' recipes start), a saved directory, or a config with random weights."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from aotforge.core.errors import InputSpecError, ModelLoadError, describe

#: How ``--student-layers N`` picks the teacher's layers: ``spread``: evenly spaced, the first and the last kept;
#: ``first``: the first N (the hidden state the head reads is then an early layer's, which training must move).
LAYER_PICKS = ("spread", "first")


def layer_map(student_layers: int, teacher_layers: int, pick: str = "spread") -> list[int]:
    """The teacher layer each student layer starts from (and is matched to by the feature loss), as ``pick`` says."""
    if pick == "first":
        return list(range(student_layers))
    if student_layers == 1:
        return [teacher_layers - 1]
    return [round(i * (teacher_layers - 1) / (student_layers - 1)) for i in range(student_layers)]


def decoder_layers(model: Any) -> tuple[str, int]:
    """The name of ``model``'s list of decoder layers (``model.layers``, ``transformer.h``, ...) and its length."""
    import torch

    count = int(model.config.num_hidden_layers)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return name, count
    raise InputSpecError(f"{type(model).__name__} has no list of {count} decoder layers to take a student from")


def student_from_layers(teacher: Any, layers: int, pick: str = "spread") -> Any:
    """``teacher`` with ``layers`` of its decoder layers (:func:`layer_map`), every other weight copied; the teacher
    layers it took as ``student.teacher_layers`` (what the feature loss matches each student layer to)."""
    prefix, count = decoder_layers(teacher)
    if not 1 <= layers < count:
        raise InputSpecError(f"--student-layers {layers}: the teacher has {count} layers; give 1 to {count - 1}")
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = layers
    student = type(teacher)(config)
    picks = layer_map(layers, count, pick)
    teacher_state = teacher.state_dict()
    state = {}
    for key in student.state_dict():
        if key.startswith(prefix + "."):
            index, rest = key[len(prefix) + 1 :].split(".", 1)
            key_in_teacher = f"{prefix}.{picks[int(index)]}.{rest}"
        else:
            key_in_teacher = key
        state[key] = teacher_state[key_in_teacher].detach().clone()
    student.load_state_dict(state, strict=True)
    student.teacher_layers = picks
    return student


def student_from_path(path: Path, teacher: Any) -> Any:
    """A saved causal-LM directory (its weights), or a config JSON file (random weights) of the same vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        if path.is_dir():
            student = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        elif path.is_file():
            student = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
        else:
            raise InputSpecError(f"--student {path}: no such directory or config file")
    except InputSpecError:
        raise
    except Exception as e:
        raise ModelLoadError(
            f"--student {path}: transformers cannot make a causal LM of it: {describe(e)}; give a saved causal-LM "
            "directory or its config.json"
        ) from e
    if student.config.vocab_size != teacher.config.vocab_size:
        raise InputSpecError(
            f"--student {path} has a vocabulary of {student.config.vocab_size}, the teacher "
            f"{teacher.config.vocab_size}: a student distilled from the teacher's logits (and a draft for it) "
            "needs the teacher's vocabulary"
        )
    return student
