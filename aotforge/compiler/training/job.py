"""``aotforge distill`` as a function: load the teacher, make the student, distill, and write the student as a
transformers directory (weights, config, the teacher's tokenizer, chat template and generation config, and
``distill_report.json``) in one rename, so a run that fails or is interrupted leaves nothing behind. ``aotforge
qat`` (``qat.py``) loads and writes through the same functions."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from aotforge.compiler.generative.source import CausalLM, load_causal_lm
from aotforge.compiler.training.distill import Progress, distill
from aotforge.compiler.training.options import DistillOptions
from aotforge.compiler.training.students import student_from_layers, student_from_path
from aotforge.compiler.training.sub_vocab import frequent_vocab, restrict_vocab, special_ids
from aotforge.compiler.training.text import token_streams
from aotforge.core.decoder import DRAFT_VOCAB_FILE
from aotforge.core.errors import InputSpecError, OptionsError
from aotforge.targets.generative.draft_vocab import DraftVocab

REPORT_FILE = "distill_report.json"


def distill_model(
    teacher: Any,
    out: Path,
    *,
    student: Path | None = None,
    student_layers: int | None = None,
    layer_pick: str = "spread",
    text: tuple[Path, ...] = (),
    options: DistillOptions = DistillOptions(),
    draft_vocab: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Distill ``teacher`` (a causal-LM directory, GGUF or ``.py`` file) into ``out``; the report.

    ``draft_vocab``: the student keeps only the training text's most frequent tokens in its embedding and head (a
    draft's reduced vocabulary, ``sub_vocab.py``), the map written beside it for speculative decoding."""
    if (student is None) == (student_layers is None):
        raise OptionsError("give exactly one of --student (a directory or config.json) and --student-layers N")
    check_out(out)
    source, tokenizer = load_teacher(teacher)
    model = source.model
    if student is not None:
        made = student_from_path(student, model)
    else:
        assert student_layers is not None  # exactly one of the two, checked above
        made = student_from_layers(model, student_layers, layer_pick)
    picks = getattr(made, "teacher_layers", None)
    streams = token_streams(text, tokenizer, options.held_out_tokens)
    vocab = None
    if draft_vocab:
        full = int(model.config.vocab_size)
        vocab = frequent_vocab(streams.train, draft_vocab, full, special_ids(model, tokenizer))
        made = restrict_vocab(made, vocab)
        made.teacher_layers = picks
    report: dict[str, Any] = {
        "teacher": str(teacher),
        "student": str(student) if student else f"{student_layers} teacher layers ({layer_pick})",
    }
    if vocab is not None:
        report["draft_vocab"] = len(vocab.ids)
    report |= distill(model, made, streams, options, progress, vocab)
    write_model(out, made, source, report, REPORT_FILE, vocab)
    return report


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that holds something (nothing is ever written over)."""
    if out.exists() and any(out.iterdir()):
        raise InputSpecError(f"--out {out} exists and is not empty: give a new directory")


def load_teacher(teacher: Any) -> tuple[CausalLM, Any]:
    """The causal LM at ``teacher`` and its tokenizer (training text needs one)."""
    from transformers import AutoTokenizer

    source = load_causal_lm(teacher)
    if source.tokenizer_dir is None:
        raise InputSpecError(f"{teacher} has no tokenizer files: the training text cannot be tokenized")
    return source, AutoTokenizer.from_pretrained(source.tokenizer_dir, local_files_only=True)


def write_model(
    out: Path,
    model: Any,
    source: CausalLM,
    report: dict[str, Any],
    report_file: str,
    vocab: DraftVocab | None = None,
) -> None:
    """``model`` as a transformers directory at ``out`` with ``source``'s tokenizer files, the report and a reduced
    vocabulary's map, in one rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        staged = Path(tmp) / "model"
        model.save_pretrained(staged)
        for name, file in source.files.items():
            if name != "config.json":
                shutil.copyfile(file, staged / name)
        (staged / report_file).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        if vocab is not None:
            vocab.write(staged / DRAFT_VOCAB_FILE)
        if out.exists():
            out.rmdir()  # empty (checked before training): the rename takes its place
        staged.rename(out)
