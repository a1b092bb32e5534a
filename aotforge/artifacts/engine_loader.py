"""A text-generation artifact loaded into the serving runtime: its engine, tokenizer, stop ids and chat template.

What the runtime needs of an artifact beyond the target's model runner lives in the artifact's files (the model
directory's tokenizer and generation config, which the build copies), so it is read here, on the artifacts floor,
and the runtime below imports nothing of the artifacts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from aotforge.artifacts.loader import load
from aotforge.artifacts.model_defaults import eos_token_ids, load_tokenizer
from aotforge.core.errors import InputSpecError
from aotforge.core.placement import Placement
from aotforge.runtime.async_engine import AsyncEngine
from aotforge.runtime.engine import LLMEngine
from aotforge.runtime.params import EngineConfig


def load_async_engine(
    path: str | Path, config: EngineConfig | None = None, placement: Placement | None = None
) -> AsyncEngine:
    """The engine ``aotforge serve`` runs over the artifact at ``path`` (verified as ``aotforge.load`` does)."""
    return AsyncEngine(*load_engine(path, config or EngineConfig(), placement))


def load_engine(
    path: str | Path, config: EngineConfig, placement: Placement | None = None
) -> tuple[LLMEngine, str, str | None]:
    """The engine over a text-generation artifact, its name, and its chat template (or None); ``placement`` says
    where a sharded artifact's workers run."""
    path = Path(path)
    loaded = load(path, placement=placement)
    engine = loaded._generative().engine
    spec = engine.spec
    if not config.max_num_seqs:
        config = dataclasses.replace(config, max_num_seqs=spec.max_batch)
    if config.max_num_seqs > spec.max_batch:
        raise InputSpecError(
            f"--max-num-seqs {config.max_num_seqs} is more than the artifact's max_batch {spec.max_batch}: ask for at "
            f"most {spec.max_batch}, or rebuild it with --max-batch {config.max_num_seqs}"
        )
    tokenizer = load_tokenizer(path)
    runner = engine.model_runner(config.max_num_seqs)
    chat_template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    llm = LLMEngine(runner, config, tokenizer, eos_token_ids(path, tokenizer))
    return llm, loaded.manifest.name, chat_template
