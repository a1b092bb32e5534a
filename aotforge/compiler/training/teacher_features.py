"""A feature draft's training data, made once: the teacher's LM-head input ``h`` at every position of some token
sequences (one prefill each: cheap beside decoding), its greedy next token over its whole vocabulary there, and its
``top_k`` largest logits over the draft's sub-vocabulary; cached on disk by everything they depend on, with what
they cost (a run that reads them back still counts it)."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np

from aotforge.compiler.training.teacher import Teacher
from aotforge.compiler.training.teacher_data import cache_dir, cache_key, write_npz

#: Sequences per prefill: bounds the full-vocabulary logits held at once (batch x len x vocab).
PREFILL_BATCH = 8


@dataclasses.dataclass(frozen=True)
class TeacherFeatures:
    """Per position of ``ids [n, len]``: ``hidden [n, len, d]`` float16, ``greedy [n, len]`` (the teacher's argmax,
    its id), ``top_ids`` / ``top_logits [n, len, k]`` (sub-vocabulary indices of its largest logits, and those)."""

    ids: np.ndarray
    hidden: np.ndarray
    greedy: np.ndarray
    top_ids: np.ndarray
    top_logits: np.ndarray
    seconds: float
    cpu_seconds: float
    cached: bool


def teacher_features(teacher: Teacher, ids: np.ndarray, top_k: int) -> TeacherFeatures:
    """The teacher's features on ``ids``; read from the cache when there."""
    path = cache_dir() / f"{cache_key(teacher, ids, ['features', top_k])}.npz"
    if path.is_file():
        with np.load(path) as data:
            cost = json.loads(str(data["cost"]))
            hidden, greedy, top_ids, top_logits = (data[k] for k in ("hidden", "greedy", "top_ids", "top_logits"))
            return TeacherFeatures(ids, hidden, greedy, top_ids, top_logits, cost["seconds"], cost["cpu_seconds"], True)
    made = _prefill(teacher, ids, top_k)
    write_npz(
        path,
        made.seconds,
        made.cpu_seconds,
        hidden=made.hidden,
        greedy=made.greedy,
        top_ids=made.top_ids,
        top_logits=made.top_logits,
    )
    return made


def _prefill(teacher: Teacher, ids: np.ndarray, top_k: int) -> TeacherFeatures:
    import torch

    wall, cpu = time.perf_counter(), time.process_time()
    parts: dict[str, list[np.ndarray]] = {"hidden": [], "greedy": [], "top_ids": [], "top_logits": []}
    with torch.no_grad():
        for start in range(0, len(ids), PREFILL_BATCH):
            chunk = torch.from_numpy(np.ascontiguousarray(ids[start : start + PREFILL_BATCH], dtype=np.int64))
            hidden = teacher.base(input_ids=chunk).last_hidden_state
            full = torch.nn.functional.linear(hidden, teacher.weight, teacher.bias)
            values, indices = teacher.sub_logits(hidden).topk(min(top_k, len(teacher.sub_weight)), dim=-1)
            parts["hidden"].append(hidden.to(torch.float16).numpy())
            parts["greedy"].append(full.argmax(-1).numpy())
            parts["top_ids"].append(indices.to(torch.int32).numpy())
            parts["top_logits"].append(values.to(torch.float16).numpy())
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    hidden, greedy, top_ids, top_logits = (
        np.concatenate(parts[k]) for k in ("hidden", "greedy", "top_ids", "top_logits")
    )
    return TeacherFeatures(ids, hidden, greedy, top_ids, top_logits, seconds, cpu_seconds, False)
