"""``aotforge qat``: quantization-aware training of a causal LM for one target's int4 (quantization-aware
distillation, as NVIDIA ModelOpt recommends for low-bit QAT).

The student is the model itself, its weights first calibrated as an int4 build would (``weight-only.method``,
``compiler/generative/calibrate.py``, on the training text), then trained with the target's exact rounding in the
forward pass (``fake_quant.py``: straight-through estimator) to match the fp32 model's next-token distribution —
the distillation loop of ``distill.py``, the fp32 model its teacher. The report's ``before`` / ``after`` are the
fake-quantized model's held-out perplexity (what the target's int4 computes, weights-wise) beside the fp32 one's.

What it writes is the trained float weights: the target's round-to-nearest of them is what training saw. Its
``config.json`` carries ``aotforge_qat`` (the grid it trained for), and a build of it skips calibration
(``weight_calibration.py``): calibrating again would move the weights off the grid they were trained on.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from aotforge.compiler.generative.calibrate import calibrated_copy
from aotforge.compiler.generative.weight_calibration import QAT_CONFIG_KEY
from aotforge.compiler.training.distill import Progress, distill
from aotforge.compiler.training.fake_quant import add_fake_quant, remove_fake_quant
from aotforge.compiler.training.job import check_out, load_teacher, write_model
from aotforge.compiler.training.options import QAT_OPTIONS, DistillOptions, Placement
from aotforge.compiler.training.text import token_streams
from aotforge.core.errors import OptionsError
from aotforge.passes.quantize_weight_only import CALIBRATED, DECODER_INT4_METHOD

REPORT_FILE = "qat_report.json"


def qat_model(
    model: Any,
    out: Path,
    *,
    where: Placement,
    method: str | None = None,
    text: tuple[Path, ...] = (),
    options: DistillOptions = QAT_OPTIONS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train ``model`` (a causal-LM directory, GGUF or ``.py`` file) for ``where``'s grid, into ``out``; the report.

    ``method``: how the starting int4 weights are calibrated (default: what an int4 build uses)."""
    method = method or DECODER_INT4_METHOD
    if method not in ("rtn", *CALIBRATED):
        raise OptionsError(
            f"--method: the starting weights come from one of rtn, {', '.join(CALIBRATED)}, not {method!r}"
        )
    check_out(out)
    source, tokenizer = load_teacher(model)
    streams = token_streams(text, tokenizer, options.held_out_tokens)
    teacher = source.model
    calibration: dict[str, Any] = {}
    if method in CALIBRATED:
        (progress or (lambda _m: None))(f"calibrating the starting int4 weights ({method}) on the training text")
        student, calibration = calibrated_copy(teacher, method, streams.train, where.block_size)
    else:
        student = copy.deepcopy(teacher)
    bits = add_fake_quant(student, where)
    report: dict[str, Any] = {"model": str(model), "grid": dataclasses.asdict(where), "start": calibration}
    report |= {"start_method": method, "weights_fake_quantized": len(bits)}
    report |= distill(teacher, student, streams, options, progress)
    before, after = report["before"], report["after"]
    gap = before["student_perplexity"] - before["teacher_perplexity"]
    closed = before["student_perplexity"] - after["student_perplexity"]
    report["gap_recovered"] = round(closed / gap, 4) if gap > 0 else None
    remove_fake_quant(student)
    student.config.update({QAT_CONFIG_KEY: {**dataclasses.asdict(where), "layers_8bit": list(where.layers_8bit)}})
    write_model(out, student, source, report, REPORT_FILE)
    return report
