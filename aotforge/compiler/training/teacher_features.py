"""A feature draft's training data, made once: the teacher's LM-head input ``h`` at every position of some token
sequences (one prefill each: cheap beside decoding; for the teacher's own greedy continuations, kept from the pass
that decodes them), its greedy next token over its whole vocabulary there, and its
``top_k`` largest logits over the draft's sub-vocabulary; cached on disk by everything they depend on, with what
they cost (a run that reads them back still counts it)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from aotforge.compiler.training.teacher import Teacher
from aotforge.compiler.training.teacher_data import GENERATE_BATCH, cache_dir, cache_key, write_npz

#: ``TeacherFeatures``' arrays, as the cache stores them.
FIELDS = ("ids", "hidden", "greedy", "top_ids", "top_logits")
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
        return _read(path, ids)
    made = _prefill(teacher, ids, top_k)
    _write(path, made)
    return made


def continued_features(teacher: Teacher, prompts: np.ndarray, new_tokens: int, top_k: int) -> TeacherFeatures:
    """``prompts [n, p]`` continued by ``teacher`` for ``new_tokens`` greedy tokens (``teacher_data``'s pool) with the
    features of every position kept from that same pass: no second prefill over the pool. Read from the cache when
    there."""
    path = cache_dir() / f"{cache_key(teacher, prompts, ['continued-features', new_tokens, top_k])}.npz"
    if path.is_file():
        return _read(path)
    made = _continue(teacher, prompts, new_tokens, top_k)
    _write(path, made)
    return made


def joined(*parts: TeacherFeatures) -> TeacherFeatures:
    """Features of sequences of one length made apart, as one set (their costs added)."""
    arrays = {k: np.concatenate([getattr(p, k) for p in parts]) for k in FIELDS}
    seconds, cpu = sum(p.seconds for p in parts), sum(p.cpu_seconds for p in parts)
    return _of(arrays, seconds, cpu, all(p.cached for p in parts))


def _continue(teacher: Teacher, prompts: np.ndarray, new_tokens: int, top_k: int) -> TeacherFeatures:
    import torch

    wall, cpu = time.perf_counter(), time.process_time()
    parts: dict[str, list[np.ndarray]] = {k: [] for k in FIELDS}
    for start in range(0, len(prompts), GENERATE_BATCH):
        chunk = torch.from_numpy(np.ascontiguousarray(prompts[start : start + GENERATE_BATCH], dtype=np.int64))
        ids, hidden, greedy = teacher.continue_greedy_hidden(chunk, new_tokens)
        with torch.no_grad():
            values, indices = teacher.sub_logits(hidden).topk(min(top_k, len(teacher.sub_weight)), dim=-1)
        parts["ids"].append(ids.numpy())
        parts["hidden"].append(hidden.to(torch.float16).numpy())
        parts["greedy"].append(greedy.numpy())
        parts["top_ids"].append(indices.to(torch.int32).numpy())
        parts["top_logits"].append(values.to(torch.float16).numpy())
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    return _of({k: np.concatenate(parts[k]) for k in FIELDS}, seconds, cpu_seconds, False)


def _of(arrays: dict[str, np.ndarray], seconds: float, cpu_seconds: float, cached: bool) -> TeacherFeatures:
    a = arrays
    return TeacherFeatures(
        a["ids"], a["hidden"], a["greedy"], a["top_ids"], a["top_logits"], seconds, cpu_seconds, cached
    )


def _read(path: Path, ids: np.ndarray | None = None) -> TeacherFeatures:
    with np.load(path) as data:
        cost = json.loads(str(data["cost"]))
        arrays = {k: data[k] for k in FIELDS if k != "ids"} | {"ids": data["ids"] if ids is None else ids}
        return _of(arrays, cost["seconds"], cost["cpu_seconds"], True)


def _write(path: Path, made: TeacherFeatures) -> None:
    write_npz(
        path,
        made.seconds,
        made.cpu_seconds,
        ids=made.ids,
        hidden=made.hidden,
        greedy=made.greedy,
        top_ids=made.top_ids,
        top_logits=made.top_logits,
    )


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
