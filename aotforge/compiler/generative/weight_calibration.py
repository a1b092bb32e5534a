"""The step of a text-generation build between loading the model and exporting it, for a calibrated int4.

With ``weight-only.method`` ``awq`` / ``gptq`` / ``awq+gptq`` the model exported is a calibrated copy of the
source (``calibrate.py``); with ``weight-only.sensitive_layers_8bit`` N the N layers that cost most at 4 bits
(``sensitivity.py``) join ``layers_8bit``. Both targets then round what they are given as before, so the
calibration reaches ONNX Runtime's MatMulNBits and tvm's packed kernel alike. The source model itself stays
fp32: the quality gate compares against it. The manifest gets a pass entry that says what was done and why,
each matmul's method included.

A model that ``aotforge qat`` trained (its config carries :data:`QAT_CONFIG_KEY`) is not calibrated again: its
weights were trained for the targets' round-to-nearest, which a calibration would move them off.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from aotforge.compiler.generative.calibrate import calibrated_copy, calibration_windows, layer_linears
from aotforge.compiler.generative.quality import calibration_tokens
from aotforge.compiler.generative.sensitivity import layer_costs, most_sensitive
from aotforge.compiler.generative.source import CausalLM
from aotforge.compiler.options import BuildOptions
from aotforge.core.errors import OptionsError
from aotforge.passes.quantize_weight_only import CALIBRATED

PASS = "weight-only"
#: The config key of a model trained by ``aotforge qat`` (``compiler/training/qat.py``): the grid it trained for.
QAT_CONFIG_KEY = "aotforge_qat"
#: Calibration windows the per-layer ranking reads (each layer costs one forward pass per window).
SENSITIVITY_WINDOWS = 1


def calibrated_source(
    source: CausalLM, opts: BuildOptions, params: Any, say: Callable[[str], None]
) -> tuple[Any, BuildOptions, list[dict[str, Any]]]:
    """The model to export, the options with the resolved per-layer bits, and the manifest's pass entries.

    ``params``: the build's ``weight-only`` parameters (None without the pass)."""
    layers = len(layer_linears(source.model))
    if params is None:
        return source.model, opts, []
    resolved: dict[str, Any] = {"layers": layers} if params.layers_8bit else {}
    trained = getattr(source.model.config, QAT_CONFIG_KEY, None)
    skipped = {}
    if trained and params.method in CALIBRATED:
        say(f"{source.name} was trained for the targets' int4 rounding (aotforge qat): not calibrating it again")
        skipped = {"asked": params.method, "skipped": "trained by aotforge qat", "qat": trained}
        resolved["method"] = "rtn"
        params = dataclasses.replace(params, method="rtn")
    if params.method not in CALIBRATED and not params.sensitive_layers_8bit:
        entries = [_entry(params, {"method": "rtn", **skipped}, False)] if skipped else []
        return source.model, _with_params(opts, resolved), entries
    if params.bits != 4:
        raise OptionsError(
            f"{PASS}.method={params.method} and sensitive_layers_8bit choose 4-bit weights; "
            "an 8-bit build takes method=rtn"
        )
    started = time.perf_counter()
    vocab = int(source.model.get_output_embeddings().weight.shape[0])
    tokens = calibration_tokens(opts.generation.eval_text, source.tokenizer_dir, vocab)
    model, stats = source.model, {"method": params.method, **skipped}
    if params.method in CALIBRATED:
        say(f"calibrating the int4 weights ({params.method}) on {min(len(tokens), 2048)} tokens of text")
        model, stats = calibrated_copy(source.model, params.method, tokens, params.block_size)
    chosen = list(params.layers_8bit)
    if params.sensitive_layers_8bit:
        say(f"ranking the {layers} layers by their cost at 4 bits")
        windows = calibration_windows(tokens, source.model)[:SENSITIVITY_WINDOWS]
        costs = layer_costs(source.model, model, windows, params.block_size)
        picked = most_sensitive(costs, params.sensitive_layers_8bit)
        chosen = sorted(set(chosen) | set(picked))
        stats["layer_kl_at_4_bits"] = [round(c, 6) for c in costs]
        stats["layers_8bit"] = {
            str(i): (
                f"rank {sorted(costs, reverse=True).index(costs[i]) + 1} of {layers} by mean KL at 4 bits "
                f"({costs[i]:.4g} nats)"
                if i in picked
                else "asked for (layers_8bit)"
            )
            for i in chosen
        }
    stats["method_by_matmul"] = method_by_matmul(model, params.method, chosen)
    stats["seconds"] = round(time.perf_counter() - started, 3)
    extra = {"layers_8bit": tuple(chosen), "layers": layers} if chosen else {}
    return model, _with_params(opts, resolved | extra), [_entry(params, stats, params.method in CALIBRATED)]


def method_by_matmul(model: Any, method: str, layers_8bit: list[int]) -> dict[str, str]:
    """How each matmul's weights were chosen, by name (``layer I module``; ``lm_head``), and why where not
    ``method``."""
    out = {
        lin.name: method if i not in layers_8bit else f"{method}, then rounded to 8 bits (layers_8bit)"
        for i, layer in enumerate(layer_linears(model))
        for lin in layer
    }
    if method in CALIBRATED:
        out["lm_head"] = "rtn at head_bits (not calibrated: tied to the embedding, a change would move the lookups)"
    return out


def _entry(params: Any, stats: dict[str, Any], changes_numerics: bool) -> dict[str, Any]:
    return {
        "name": "calibrate-int4",
        "params": {"method": params.method, "sensitive_layers_8bit": params.sensitive_layers_8bit},
        "stats": stats,
        "graph": "source model (torch), before the export",
        "changes_numerics": changes_numerics,
    }


def _with_params(opts: BuildOptions, extra: dict[str, Any]) -> BuildOptions:
    if not extra:
        return opts
    params = {**opts.passes.params, PASS: {**opts.passes.params.get(PASS, {}), **extra}}
    return opts.with_fields({"passes.params": params})


def weight_only_params(passes: list[Any]) -> Any:
    """The ``weight-only`` pass's parameters among the build's passes, None without it."""
    return next((p.params for p in passes if p.name == PASS), None)
