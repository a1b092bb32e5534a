"""A feature draft's training data, made once: the teacher's LM-head input ``h`` at every position of some token
sequences (one prefill each: cheap beside decoding; for the teacher's own greedy continuations, kept from the pass
that decodes them), its greedy next token over its whole vocabulary there, and its
``top_k`` largest logits over the draft's sub-vocabulary; cached on disk by everything they depend on, with what
they cost (a run that reads them back still counts it)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
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


#: Sequences per cached chunk: a run whose data has a share of its budget stops between chunks, and a later run with
#: the same inputs reads back the chunks made so far and stops at the same one.
CHUNK = GENERATE_BATCH


def _never(_seconds: float, _cpu_seconds: float) -> bool:
    return False


def teacher_features(
    teacher: Teacher, ids: np.ndarray, top_k: int, enough: Callable[[float, float], bool] = _never
) -> TeacherFeatures:
    """The teacher's features on ``ids``, a chunk at a time (each read from the cache when there) until every
    sequence is done or ``enough(seconds, cpu_seconds)`` says the chunks made so far cost enough."""
    return _chunked(teacher, ids, ["features", top_k], lambda chunk: _prefill(teacher, chunk, top_k), enough)


def continued_features(
    teacher: Teacher,
    prompts: np.ndarray,
    new_tokens: int,
    top_k: int,
    enough: Callable[[float, float], bool] = _never,
) -> TeacherFeatures:
    """``prompts [n, p]`` continued by ``teacher`` for ``new_tokens`` greedy tokens (``teacher_data``'s pool) with the
    features of every position kept from that same pass: no second prefill over the pool. Made a chunk at a time as
    ``teacher_features`` is."""
    sizes: list[object] = ["continued-features", new_tokens, top_k]
    return _chunked(teacher, prompts, sizes, lambda chunk: _continue(teacher, chunk, new_tokens, top_k), enough)


def _chunked(
    teacher: Teacher,
    rows: np.ndarray,
    sizes: list[object],
    make: Callable[[np.ndarray], TeacherFeatures],
    enough: Callable[[float, float], bool],
) -> TeacherFeatures:
    """At least one chunk of ``rows``, made by ``make`` or read from its cache file, then more until ``enough``."""
    parts: list[TeacherFeatures] = []
    key = cache_key(teacher, rows, [*sizes, CHUNK])  # once: the key hashes every weight of the teacher
    for start in range(0, len(rows), CHUNK):
        if parts and enough(sum(p.seconds for p in parts), sum(p.cpu_seconds for p in parts)):
            break
        chunk = np.ascontiguousarray(rows[start : start + CHUNK], dtype=np.int64)
        path = cache_dir() / f"{key}-{start // CHUNK}.npz"
        if path.is_file():
            parts.append(_read(path))
        else:
            parts.append(make(chunk))
            _write(path, parts[-1])
    return joined(*parts)


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


def _read(path: Path) -> TeacherFeatures:
    with np.load(path) as data:
        cost = json.loads(str(data["cost"]))
        return _of({k: data[k] for k in FIELDS}, cost["seconds"], cost["cpu_seconds"], True)


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
