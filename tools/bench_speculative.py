"""Speculative-decoding benchmark: target-only greedy decoding vs speculative decoding with each k, batch 1.

On the trained byte-level pair of ``tests/lm_pair.py`` (or --target-model / --draft-model directories): per
target (--targets onnxruntime,tvm), the target built with --speculative-k max(--ks) and, on tvm, the draft
with --speculative-k 1 (its own verify graph folds its catch-up step into its first proposal: ``speculative``;
on onnxruntime that call costs more than the two decode calls it replaces, so the draft has none there),
both with one intra-op thread on onnxruntime (models this small are per-node overhead, and a second thread
spins at each node). Target-only decoding, speculative decoding with each k of --ks and the draft alone
run each in their own process, alternating for --rounds rounds, each round starting one run later (a load
that drifts favours no run), over --prompts held-out text prompts of 64 bytes, --new tokens each. Per run:
tokens/s (wall) and CPU ms per token (process time: what a shared machine's load moves less) of the decode
phase, after each prompt's first token (the manifest's ``tokens_per_s``; the first token is TTFT, both
prefills in it), and end to end; the acceptance rate. The speed-ups over target-only are medians of each
round's own ratio; the best k is the one with the highest decode speed-up. Also whether every run's tokens
are the target's own greedy tokens. The load average is printed before and after.

A feature draft (``aotforge distill``'s feature-draft directory, ``feature_draft.json`` in it) as --draft-model
is not built: each speculative run passes the directory as ``draft=`` (proposals from the target's own hidden
state), and there is no "draft only" run.

    python tools/bench_speculative.py --work /tmp/aotforge-spec-bench [--ks 1,2,3,4] [--targets onnxruntime]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import bench_record  # tools/, beside this script
import numpy as np
from bench_children import PREFIX, median_of, run_child, text_generation_artifact  # tools/, beside this script
from speculative_tables import page_tables, table  # tools/, beside this script

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN = 64
#: The speed-ups over target-only, each the median of the rounds' own ratios: (name, field, lower is faster).
RATIOS = (
    ("speed_up", "tokens_per_s", False),
    ("cpu_speed_up", "cpu_ms_per_token", True),
    ("end_to_end_speed_up", "end_to_end_tokens_per_s", False),
)


def models(args: argparse.Namespace) -> tuple[Path, Path, list[list[int]]]:
    """The target and draft model directories and the held-out prompts (token ids) the bench decodes after."""
    if args.target_model and args.draft_model:
        if (args.target_model / "tokenizer.json").is_file():  # a real model: prompts of held-out English
            return args.target_model, args.draft_model, text_prompts(args.target_model, args.prompts)
        rng = np.random.default_rng(0)
        vocab = json.loads((args.target_model / "config.json").read_text())["vocab_size"]
        prompts = [[int(t) for t in rng.integers(0, vocab, PROMPT_LEN)] for _ in range(args.prompts)]
        return args.target_model, args.draft_model, prompts
    sys.path.insert(0, str(ROOT))
    from tests.lm_bytes import encode
    from tests.lm_pair import trained_pair

    pair = trained_pair()
    text = pair.heldout_text
    step = len(text) // args.prompts
    prompts = [encode(text[i * step : i * step + PROMPT_LEN]) for i in range(args.prompts)]
    return pair.target_dir, pair.draft_dir, prompts


def text_prompts(model_dir: Path, count: int) -> list[list[int]]:
    """``count`` prompts of ``PROMPT_LEN`` tokens, evenly spaced through the quality gate's held-out corpus (stdlib
    docstrings no ``aotforge distill`` / ``qat`` run trains on by default), tokenized with the model's tokenizer."""
    from transformers import AutoTokenizer

    from aotforge.compiler.generative.quality import default_corpus

    ids = AutoTokenizer.from_pretrained(model_dir)(default_corpus(), add_special_tokens=False)["input_ids"]
    step = (len(ids) - PROMPT_LEN) // count
    return [[int(t) for t in ids[i * step : i * step + PROMPT_LEN]] for i in range(count)]


def build(model_dir: Path, work: Path, target: str, role: str, k: int, max_seq: int) -> str:
    """The target (verify graph of ``k`` + 1 tokens) or the draft (on tvm a verify graph of 2), built into ``work``.

    An onnxruntime draft gets no verify graph: its verify call of 2 tokens cost more CPU than the two decode calls
    it replaces (its session's own copy of the weights is cold in cache)."""
    spec_k = k if role == "target" else 1 if target == "tvm" else 0
    # A draft's name says which directory it came from: a new draft in the same --work is built, not reused. A
    # target's says its graphs return the hidden state (a feature draft's input): one built before is not reused.
    which = "-h" if role == "target" else "-" + hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:8]
    return text_generation_artifact(
        model_dir,
        work / "artifacts",
        f"spec-{role}-{spec_k}-{max_seq}-1t{which}",
        target,
        max_seq_len=max_seq,
        max_batch=1,
        speculative_k=spec_k,
        target_options={"intra_op_threads": 1} if target == "onnxruntime" else {},
    )


def run(target: Path, draft: Path | None, k: int, prompts: list[list[int]], new: int) -> dict[str, Any]:
    """Batch-1 greedy decoding of ``new`` tokens after each prompt, streamed: tokens/s and CPU time per token of
    the decode phase (after each prompt's first token: what the manifest's ``tokens_per_s`` counts; the first
    token's time, prefill included, is TTFT) and end to end (prefills included), the acceptance rate."""
    import aotforge
    from aotforge.targets.generative.feature_draft import is_feature_draft, load_feature_draft

    artifact = aotforge.load(target)
    kw: dict[str, Any] = {}
    if draft is not None:
        kw = {"draft": load_feature_draft(draft) if is_feature_draft(draft) else aotforge.load(draft)}
        kw["num_speculative_tokens"] = k
    artifact.generate(np.array([prompts[0]]), 8, ignore_eos=True, **kw)  # warm-up
    proposed = accepted = 0
    decode_wall = decode_cpu = 0.0
    cpu, start = time.process_time(), time.perf_counter()
    outputs = []
    for prompt in prompts:
        tokens: list[int] = []
        for column in artifact.stream(np.array([prompt]), new, ignore_eos=True, **kw):
            if not tokens:
                first_wall, first_cpu = time.perf_counter(), time.process_time()
            tokens.append(int(column[0]))
        decode_wall += time.perf_counter() - first_wall
        decode_cpu += time.process_time() - first_cpu
        outputs.append(tokens)
        stats = artifact.speculative_stats if draft is not None else {}
        proposed, accepted = proposed + stats.get("proposed", 0), accepted + stats.get("accepted", 0)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    decoded = len(prompts) * (new - 1)
    return {
        "tokens_per_s": round(decoded / decode_wall, 2),
        "cpu_ms_per_token": round(decode_cpu * 1000.0 / decoded, 4),
        "end_to_end_tokens_per_s": round(len(prompts) * new / wall, 2),
        "end_to_end_cpu_ms_per_token": round(cpu * 1000.0 / (len(prompts) * new), 4),
        "acceptance_rate": round(accepted / proposed, 4) if proposed else None,
        "tokens_sha": hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:12],
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    """``--one build:TARGET:ROLE`` or ``--one run:TARGET:ARTIFACT|DRAFT|K``: one step, in this process."""
    target_dir, draft_dir, prompts = models(args)
    ks = [int(k) for k in args.ks.split(",")]
    kind, target, rest = args.one.split(":", 2)
    if kind == "build":
        model = target_dir if rest == "target" else draft_dir
        return {"path": build(model, args.work, target, rest, max(ks), max_seq_len(args))}
    artifact, draft, k = rest.split("|")
    return run(Path(artifact), Path(draft) if draft else None, int(k), prompts, args.new)


def max_seq_len(args: argparse.Namespace) -> int:
    need = PROMPT_LEN + args.new + max(int(k) for k in args.ks.split(",")) + 2
    return 1 << (need - 1).bit_length()


def feature_draft(args: argparse.Namespace) -> bool:
    """Whether --draft-model is a feature draft's directory (run as it is, not built)."""
    return bool(args.draft_model and (args.draft_model / "feature_draft.json").is_file())


def bench_target(args: argparse.Namespace, target: str) -> dict[str, Any]:
    paths = {"target": spawn(args, f"build:{target}:target")}
    paths["draft"] = {"path": str(args.draft_model)} if feature_draft(args) else spawn(args, f"build:{target}:draft")
    if any("path" not in v for v in paths.values()):
        return {"error": paths}
    runs = [("target only", f"run:{target}:{paths['target']['path']}||0")]
    runs += [
        (f"k={k}", f"run:{target}:{paths['target']['path']}|{paths['draft']['path']}|{k}") for k in args.ks.split(",")
    ]
    if not (args.draft_model and (args.draft_model / "draft_vocab.json").is_file()) and not feature_draft(args):
        # (a subset's draft reads no prompt; a feature draft has no prefill of its own)
        runs.append(("draft only", f"run:{target}:{paths['draft']['path']}||0"))
    rounds: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.rounds):  # each round starts one run later: a load that drifts favours no run
        for label, kind in runs[r % len(runs) :] + runs[: r % len(runs)]:
            rounds.setdefault(label, []).append(spawn(args, kind))
    table = {label: median_of(r) for label, r in rounds.items()}
    for label, row in table.items():  # each round's ratio to target-only of the same round, then their median
        pairs = [(b, x) for b, x in zip(rounds["target only"], rounds[label], strict=True) if "error" not in b | x]
        for key, field, inverse in RATIOS if pairs else ():
            ratios = [b[field] / x[field] if inverse else x[field] / b[field] for b, x in pairs]
            row[key] = round(float(np.median(ratios)), 3)
            row[f"{key}_rounds"] = [round(x, 4) for x in ratios]
    spec = {label: r for label, r in table.items() if label.startswith("k=") and "speed_up" in r}
    best = max(spec, key=lambda label: spec[label]["speed_up"]) if spec else None
    same = {r.get("tokens_sha") for label, r in table.items() if label != "draft only"}
    return {"runs": table, "best": best, "identical_tokens": len(same) == 1, "rounds": rounds}


def spawn(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--work", str(args.work), "--one", kind, "--ks", args.ks]
    cmd += ["--new", str(args.new), "--prompts", str(args.prompts)]
    for flag in ("target_model", "draft_model"):
        if getattr(args, flag):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return run_child(cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-spec-bench"))
    parser.add_argument("--targets", default="onnxruntime,tvm")
    parser.add_argument("--ks", default="2,3,4,6", help="the numbers of draft tokens per round tried")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new", type=int, default=96, help="new tokens per prompt")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--target-model", type=Path, help="a target model directory (default: the trained pair)")
    parser.add_argument("--draft-model", type=Path, help="its draft's model directory")
    parser.add_argument("--name", default="speculative", help="the bench's name on the page (docs/bench/NAME.json)")
    parser.add_argument("--json", type=Path, help="the page's file (default: docs/bench/NAME.json)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one build or run, prints RESULT JSON
    args = parser.parse_args()
    args.json = args.json or bench_record.BENCH_DIR / f"{args.name}.json"
    args.work.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(PREFIX + json.dumps(child(args)))
        return
    run = bench_record.start({k: v for k, v in vars(args).items() if k != "one"})
    models(args)  # the pair trains (or loads) once, before any child needs it
    results: dict[str, Any] = {"load_before": os.getloadavg(), "prompts": args.prompts, "new_tokens": args.new}
    trained = args.draft_model / "distill_report.json" if args.draft_model else None
    if trained is not None and trained.is_file():  # how the draft was made: the page says it beside its speed
        report = json.loads(trained.read_text())
        keep = ("student", "draft_vocab", "steps", "train_seconds", "train_cpu_seconds", "pool_cpu_seconds")
        keep += ("tokens_seen", "distinct_tokens", "options")
        results["draft_training"] = {k: report.get(k) for k in keep} | {"held_out": report.get("after")}
    if feature_draft(args):  # its sizes and how it was made, beside its speed
        config = json.loads((args.draft_model / "feature_draft.json").read_text())
        results["feature_draft"] = {k: v for k, v in config.items() if k not in ("format", "version")}
    for target in filter(None, args.targets.split(",")):
        results[target] = bench_target(args, target)
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    print(table(results))
    bench_record.write(args.json, args.name, run, page_tables(results), results)


if __name__ == "__main__":
    main()
