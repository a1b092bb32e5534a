"""Quality gates of weight-only text-generation builds on the trained target (``tests/lm_pair.py``), any target.

Held-out perplexity through the fp32 artifact and each quantized one (each within its allowed increase over
fp32), and greedy agreement with the fp32 artifact over 64 tokens after four held-out prompts (reported). The
slow tests of ``test_weight_only_decoder.py`` (onnxruntime) and ``test_weight_only_tvm.py`` run it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tests.lm_bytes import encode
from tests.lm_pair import PPL_WINDOW, LmPair

#: Held-out tokens the gates score: 16 windows of 256 bytes (the window tests/lm_pair.py records its perplexity over).
GATE_TOKENS = 16 * PPL_WINDOW
#: Greedy continuations compared with the fp32 artifact's: prompts of 64 held-out bytes at these offsets.
AGREEMENT_OFFSETS = (0, 3000, 6000, 9000)
AGREEMENT_TOKENS = 64
#: (name, weight-only params, allowed perplexity increase over the fp32 artifact's).
VARIANTS = (
    ("int8-g32", {"bits": 8, "block_size": 32}, 0.02),
    ("int4-g32", {"bits": 4, "block_size": 32}, 0.08),
    ("int4-g64", {"bits": 4, "block_size": 64}, 0.08),
)


def build_trained_target(pair: LmPair, out: Path, target: str, params: Mapping[str, int] | None, **kw: Any) -> Any:
    """The trained target for ``target`` at the gates' geometry, weight-only with ``params`` (None: fp32)."""
    import aotforge

    passes: dict[str, Any] = {}
    if params is not None:  # the gates judge these builds, not the build's token-exact validation
        passes = {"passes": ["weight-only"], "pass_params": {"weight-only": dict(params)}}
        passes |= {"max_perplexity_increase": 1.0}
    return aotforge.build(
        str(pair.target_dir),
        target=target,
        task="text-generation",
        out=out,
        bench=False,
        plots=False,
        max_seq_len=PPL_WINDOW,
        max_batch=4,
        **kw,
        **passes,
    )


def agreement(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """How much of each greedy continuation matches the reference: the prefix before the first difference, and
    the positions that hold the same token."""
    prefix = [int(np.argmin(np.append(r == g, False))) for r, g in zip(reference, got, strict=True)]
    return {
        "matching_prefix": round(sum(prefix) / reference.size, 4),
        "same_position": round(float(np.mean(reference == got)), 4),
    }


def quality_report(
    pair: LmPair, build: Callable[[str, Mapping[str, int] | None], Any], check: Callable[[str, Any], None]
) -> dict[str, Any]:
    """Perplexity and agreement of every variant against the fp32 build; ``build(name, params)`` builds one,
    ``check(name, result)`` asserts what the build itself must say (e.g. every projection taken)."""
    import aotforge

    tokens = np.array(encode(pair.heldout_text)[:GATE_TOKENS], dtype=np.int64)
    prompts = np.array([encode(pair.heldout_text)[o : o + 64] for o in AGREEMENT_OFFSETS], dtype=np.int64)
    fp32 = aotforge.load(build("fp32", None).path)
    base = fp32.perplexity(tokens, PPL_WINDOW).perplexity
    reference = fp32.generate(prompts, AGREEMENT_TOKENS, ignore_eos=True)[:, 64:]
    report: dict[str, Any] = {"fp32": {"perplexity": round(base, 4), "torch": pair.target_ppl}}
    for name, params, allowed in VARIANTS:
        result = build(name, params)
        check(name, result)
        quantized = aotforge.load(result.path)
        ppl = quantized.perplexity(tokens, PPL_WINDOW).perplexity
        got = quantized.generate(prompts, AGREEMENT_TOKENS, ignore_eos=True)[:, 64:]
        report[name] = {
            "perplexity": round(ppl, 4),
            "increase": round(ppl / base - 1, 4),
            "allowed": allowed,
            **agreement(reference, got),
            "weights_file_bytes": sum(n for f, n in result.manifest.file_sizes.items() if f.endswith(".data")),
        }
    return report


def assert_within_gates(report: Mapping[str, Any]) -> None:
    for name, _, allowed in VARIANTS:
        assert report[name]["increase"] <= allowed, (name, report)
