"""Sequence-level distillation's data, made once (Kim & Rush 2016): text prompts each followed by the teacher's own
greedy continuation, and the teacher's ``top_k`` largest next-token logits (over the student's vocabulary) at every
position, sparse. Decoded batched through the teacher's cache up front, not inside every step, so the student then
trains many steps on the pool; cached on disk by everything it depends on (the teacher's weights, the prompts, the
vocabulary, the sizes), with what it cost, so a run that reuses it still counts that cost against its budget."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from aotforge.compiler.training.teacher import Teacher

#: Sequences the teacher continues together: each decode step a matmul of this many rows, where the CPU's matmuls
#: are efficient, rather than a memory-bound step per sequence.
GENERATE_BATCH = 64


@dataclasses.dataclass(frozen=True)
class TeacherSequences:
    """``ids [n, len]``: each prompt then the teacher's greedy tokens (the teacher's ids); ``top_ids`` / ``top_logits``
    ``[n, len, k]``: the student's ids of the teacher's ``k`` largest logits at each position and those logits."""

    ids: np.ndarray
    top_ids: np.ndarray
    top_logits: np.ndarray
    #: What making the pool cost (wall seconds, process CPU seconds), when it was made, cached or not.
    seconds: float
    cpu_seconds: float
    cached: bool


def cache_dir() -> Path:
    """Where pools are kept (``AOTFORGE_DISTILL_CACHE`` overrides): a few MB each, named by their inputs' hash."""
    return Path(os.environ.get("AOTFORGE_DISTILL_CACHE", Path.home() / ".cache" / "aotforge" / "distill"))


def teacher_sequences(teacher: Teacher, prompts: np.ndarray, new_tokens: int, top_k: int) -> TeacherSequences:
    """``prompts [n, p]`` continued by ``teacher`` for ``new_tokens`` greedy tokens; read from the cache when there."""
    path = cache_dir() / f"{_key(teacher, prompts, new_tokens, top_k)}.npz"
    if path.is_file():
        with np.load(path) as data:
            cost = json.loads(str(data["cost"]))
            return TeacherSequences(
                data["ids"], data["top_ids"], data["top_logits"], cost["seconds"], cost["cpu_seconds"], True
            )
    made = _generate(teacher, prompts, new_tokens, top_k)
    _write(path, made)
    return made


def _generate(teacher: Teacher, prompts: np.ndarray, new_tokens: int, top_k: int) -> TeacherSequences:
    import torch

    wall, cpu = time.perf_counter(), time.process_time()
    ids, top_ids, top_logits = [], [], []
    for start in range(0, len(prompts), GENERATE_BATCH):
        chunk = torch.from_numpy(prompts[start : start + GENERATE_BATCH])
        tokens, logits = teacher.continue_greedy(chunk, new_tokens)
        values, indices = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
        ids.append(tokens.numpy())
        top_ids.append(indices.to(torch.int32).numpy())
        top_logits.append(values.to(torch.float16).numpy())
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    return TeacherSequences(
        np.concatenate(ids), np.concatenate(top_ids), np.concatenate(top_logits), seconds, cpu_seconds, False
    )


def _key(teacher: Teacher, prompts: np.ndarray, new_tokens: int, top_k: int) -> str:
    return cache_key(teacher, prompts, [new_tokens, top_k])


def cache_key(teacher: Teacher, tokens: np.ndarray, sizes: list[object]) -> str:
    """The hash of everything the teacher's outputs on ``tokens`` depend on: ``sizes``, its dtype, its weights,
    the student's tokens."""
    import torch

    digest = hashlib.sha256(json.dumps([*sizes, str(teacher.dtype), list(tokens.shape)]).encode())
    digest.update(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(teacher.ids).tobytes() if teacher.ids is not None else b"all")
    for name, tensor in sorted(teacher.source_state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def _write(path: Path, made: TeacherSequences) -> None:
    write_npz(path, made.seconds, made.cpu_seconds, ids=made.ids, top_ids=made.top_ids, top_logits=made.top_logits)


def write_npz(path: Path, seconds: float, cpu_seconds: float, **arrays: np.ndarray) -> None:
    """``arrays`` and what making them cost at ``path`` in one rename (an interrupted write leaves nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cost = json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds})
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.stem}-", suffix=".npz", delete=False) as f:
        np.savez(f, **({"cost": np.asarray(cost)} | arrays))  # type: ignore[arg-type]
    Path(f.name).rename(path)
