"""A trained Llama pair (target + smaller draft) on real English that ships with Python, made here.

No weights are downloaded: :func:`trained_pair` trains both models with torch on the CPU from a fixed
recipe (seeded, two threads) on stdlib module sources (docstrings, comments and code), holds out other
modules for perplexity, and caches the result under ``~/.cache/aotforge-tests/lm-pair-<key>``, the key
a hash of the recipe, the training text and the torch / transformers versions. The target learns the
next byte; the draft, trained in the same loop over the target's last steps, learns the target's next-byte
distribution on the same batches (KL divergence from the target's logits of that step: its greedy choices
agree with the target's more often than a draft trained on the bytes alone, which is what speculative decoding
keeps). Training takes about 146 s on 2 cores (AMD EPYC at load 2; ``meta.json`` records the wall and CPU
seconds and the load); from a warm cache the pair loads in well under a second.
Concurrent callers (several pytest processes) wait on a file lock instead of training twice.

The vocabulary is bytes (``tests/lm_bytes.py``); the recipe and the training loop: ``tests/lm_training.py``.
The target's LM head is untied, the draft's is tied to its embedding, so one pair covers both.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import shutil
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.lm_bytes import byte_tokenizer, encode
from tests.lm_training import RECIPE, train_pair

#: Stdlib modules the models learn from, and the ones they never see (the held-out text).
TRAIN_MODULES = (
    "argparse", "difflib", "functools", "collections/__init__", "dataclasses", "enum", "pathlib",
    "shutil", "tempfile", "logging/__init__", "csv", "calendar", "statistics", "random", "queue",
    "contextlib", "copy", "pprint", "weakref", "inspect", "threading", "subprocess", "doctest",
    "optparse", "gettext", "configparser", "tokenize", "codecs", "pickle", "shlex", "timeit",
    "trace", "base64", "selectors", "ipaddress", "platform", "traceback", "pkgutil", "bdb",
    "filecmp", "fileinput", "gzip", "mimetypes", "os", "posixpath", "runpy", "types",
)  # fmt: skip
HELDOUT_MODULES = ("textwrap", "heapq", "fractions", "string")
HELDOUT_CHARS = 16384

#: The window held-out perplexity is measured over (non-overlapping; each window scores its last N-1 tokens).
PPL_WINDOW = 256


@dataclasses.dataclass(frozen=True)
class LmPair:
    target_dir: Path
    draft_dir: Path
    heldout_text: str
    train_text: str
    target_ppl: float
    draft_ppl: float
    #: How the pair was made: the recipe, each model's parameter count and training seconds (cold run).
    meta: dict[str, Any]


def corpus() -> tuple[str, str]:
    """``(train_text, heldout_text)`` from the running Python's stdlib sources, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])

    def read(modules: tuple[str, ...]) -> str:
        return "\n".join((stdlib / f"{m}.py").read_text(encoding="utf-8") for m in modules)

    return read(TRAIN_MODULES), read(HELDOUT_MODULES)[:HELDOUT_CHARS]


def cache_key(train_text: str, heldout_text: str) -> str:
    import torch
    import transformers

    blob = json.dumps(
        {"recipe": RECIPE, "torch": torch.__version__, "transformers": transformers.__version__}, sort_keys=True
    )
    digest = hashlib.sha256(blob.encode())
    digest.update(hashlib.sha256(train_text.encode()).digest())
    digest.update(hashlib.sha256(heldout_text.encode()).digest())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "aotforge-tests"


def trained_pair(cache_dir: Path | None = None, progress: Callable[[str], None] | None = None) -> LmPair:
    """The pair, trained on first use and loaded from ``cache_dir`` afterwards."""
    train_text, heldout_text = corpus()
    root = (cache_dir or default_cache_dir()) / f"lm-pair-{cache_key(train_text, heldout_text)}"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process training the same pair: wait for it
        if not (root / "meta.json").is_file():
            _train_into(root, train_text, heldout_text, progress)
    meta = json.loads((root / "meta.json").read_text())
    return LmPair(
        target_dir=root / "target",
        draft_dir=root / "draft",
        heldout_text=heldout_text,
        train_text=train_text,
        target_ppl=meta["target"]["heldout_ppl"],
        draft_ppl=meta["draft"]["heldout_ppl"],
        meta=meta,
    )


def _train_into(root: Path, train_text: str, heldout_text: str, progress: Callable[[str], None] | None) -> None:
    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    meta: dict[str, Any] = {"recipe": RECIPE, "heldout_modules": HELDOUT_MODULES, "ppl_window": PPL_WINDOW}
    started, cpu = time.perf_counter(), time.process_time()
    models = dict(zip(("target", "draft"), train_pair(train_text, progress), strict=True))
    meta["training"] = {
        # Wall and CPU seconds of the one loop that trains both: on a shared machine the wall time is mostly
        # waiting for a core.
        "seconds": round(time.perf_counter() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "load_average": round(os.getloadavg()[0], 1),
    }
    for role, model in models.items():
        model.save_pretrained(tmp / role)
        byte_tokenizer().save_pretrained(tmp / role)
        meta[role] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "heldout_ppl": round(torch_perplexity(model, encode(heldout_text)), 4),
        }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)


def torch_perplexity(model: Any, ids: list[int], window: int = PPL_WINDOW) -> float:
    """exp(mean next-token NLL) over non-overlapping ``window``-token slices (each scores its last N-1)."""
    import torch

    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(ids), window):
            chunk = ids[start : start + window]
            if len(chunk) < 2:
                continue
            x = torch.tensor([chunk])
            logits = model(input_ids=x).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            count += len(chunk) - 1
    return math.exp(total / count)


def greedy_acceptance(target: Any, draft: Any, prompt: list[int], new_tokens: int, k: int = 4) -> dict[str, float]:
    """Greedy speculative decoding in plain torch (no caches): the fraction of draft proposals the target keeps.

    Each round the draft proposes ``k`` tokens greedily, the target scores them in one forward pass,
    the longest agreeing prefix is kept plus the target's own next token."""
    import torch

    ids = list(prompt)
    proposed = accepted = rounds = 0
    with torch.inference_mode():
        while len(ids) - len(prompt) < new_tokens:
            guess = list(ids)
            for _ in range(k):
                guess.append(int(draft(input_ids=torch.tensor([guess])).logits[0, -1].argmax()))
            logits = target(input_ids=torch.tensor([guess])).logits[0]
            want = logits[len(ids) - 1 :].argmax(-1).tolist()  # the target's choice after each prefix
            n = 0
            while n < k and guess[len(ids) + n] == want[n]:
                n += 1
            ids += guess[len(ids) : len(ids) + n] + [want[n]]
            proposed, accepted, rounds = proposed + k, accepted + n, rounds + 1
    return {
        "acceptance_rate": accepted / proposed,
        "tokens_per_round": (len(ids) - len(prompt)) / rounds,
        "rounds": rounds,
    }
