"""The distilled draft of SmolLM2-135M-Instruct for speculative decoding, made and timed (``make bench-draft``).

Makes the draft once into --work with ``aotforge distill`` (the recipe below: the model cut to --layers layers
(--layer-pick), its vocabulary cut to the --draft-vocab tokens most frequent in the training text, trained on the
fp32 model's greedy continuations of stdlib docstrings for a CPU-time budget that includes making them), then runs
``tools/bench_speculative.py`` on the real pair on tvm (a memory-bound fp32 decode step: checking k + 1 tokens
costs little more than one): the fp32 target with a verify graph against target-only decoding, greedy, batch 1,
each run in its own process, alternating rounds, prompts of held-out English (the quality gate's corpus, never
trained on). Writes docs/bench/draft.json (the draft's training report beside the timings) for tools/bench_page.py.

--kind feature makes a feature draft instead, with ``aotforge distill-draft``'s defaults and the same budget
(proposals from the target's own last hidden state: no cache, a few small matmuls a proposal), timed into
docs/bench/feature-draft.json. --draft names an existing directory of either kind, timed as it is.

    python tools/bench_draft.py [--kind token|feature] [--work /tmp/aotforge-draft-bench] [--ks 2,3,4,5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotforge.compiler.training.options import FeatureDraftOptions  # noqa: E402
from tools.real_model import smollm2_dir  # noqa: E402

TOOLS = Path(__file__).resolve().parent
#: ``aotforge distill``'s options for the draft: a larger learning rate than a fine-tune's (most of the student is
#: new to its neighbours), decayed over the budget; temperature 1 (greedy agreement is what acceptance follows);
#: each sequence 64 tokens of text then the teacher's own 64-token greedy continuation (sequence-level distillation:
#: the bench's prompts are followed by the teacher's greedy tokens, which the draft must predict), 768 of them made
#: up front (about a third of the budget), the teacher's 16 largest logits at each position the targets.
RECIPE = [
    "--lr", "1e-3", "--schedule", "cosine", "--warmup-steps", "20", "--temperature", "1.0",
    "--batch", "8", "--seq-len", "128", "--continuation", "64", "--pool", "768", "--top-k", "16",
]  # fmt: skip


def make_draft(
    model: Path, out: Path, layers: int, pick: str, vocab: int, cpu_minutes: float, wall_minutes: float
) -> None:
    """``aotforge distill`` of ``model`` into ``out`` (kept: a later run times the same draft)."""
    cmd = [sys.executable, "-m", "aotforge", "distill", str(model), "--out", str(out), "--student-layers", str(layers)]
    cmd += ["--layer-pick", pick]
    cmd += ["--draft-vocab", str(vocab), "--max-cpu-minutes", str(cpu_minutes), "--max-minutes", str(wall_minutes)]
    subprocess.run(cmd + RECIPE, check=True, env=_PASSIVE)


def make_feature_draft(model: Path, out: Path, cpu_minutes: float, wall_minutes: float) -> None:
    """``aotforge distill-draft`` of ``model`` into ``out`` with its defaults (kept, as ``make_draft``'s)."""
    cmd = [sys.executable, "-m", "aotforge", "distill-draft", str(model), "--out", str(out)]
    cmd += ["--max-cpu-minutes", str(cpu_minutes), "--max-minutes", str(wall_minutes)]
    subprocess.run(cmd, check=True, env=_PASSIVE)


# Threads that spin at each barrier bill CPU time while they wait for a core: on a shared host that was most of the
# budget (a 576 x 1536 matmul of 8 rows: 6.7 ms of CPU spinning against 0.17 ms passive, at load 12).
_PASSIVE = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=("token", "feature"), default="token", help="the draft to make")
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-draft-bench"))
    parser.add_argument(
        "--draft", type=Path, help="an existing draft directory, or a feature draft's (default: made into --work)"
    )
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--layer-pick", default="spread", help="aotforge distill --layer-pick")
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--cpu-minutes", type=float, default=30.0, help="the draft's training budget, CPU-minutes")
    parser.add_argument("--wall-minutes", type=float, default=60.0, help="... and its wall-clock cap")
    parser.add_argument("--ks", default="2,3,4,5")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--targets", default="tvm")
    args = parser.parse_args()
    model = smollm2_dir()
    if args.draft:
        draft = args.draft
    elif args.kind == "feature":
        recipe = _digest([dataclasses.asdict(FeatureDraftOptions()), args.cpu_minutes])
        draft = args.work / f"feature-{recipe}"
        if not (draft / "feature_draft.json").is_file():
            make_feature_draft(model, draft, args.cpu_minutes, args.wall_minutes)
    else:
        draft = (
            args.work
            / f"draft-{args.layers}l-{args.layer_pick}-{args.draft_vocab}v-{_digest([RECIPE, args.cpu_minutes])}"
        )
        if not (draft / "config.json").is_file():
            make_draft(
                model, draft, args.layers, args.layer_pick, args.draft_vocab, args.cpu_minutes, args.wall_minutes
            )
    feature = (draft / "feature_draft.json").is_file()
    name = "feature-draft" if feature else "draft"
    cmd = [sys.executable, str(TOOLS / "bench_speculative.py"), "--name", name, "--work", str(args.work)]
    cmd += ["--target-model", str(model), "--draft-model", str(draft), "--ks", args.ks, "--rounds", str(args.rounds)]
    cmd += ["--prompts", str(args.prompts), "--targets", args.targets]
    subprocess.run(cmd, check=True)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:8]


if __name__ == "__main__":
    main()
