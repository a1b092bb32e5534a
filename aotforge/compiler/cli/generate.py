"""``aotforge generate``: decode tokens with a text-generation artifact, streamed as they come."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.common import user_errors
from aotforge.compiler.cli.placement_flags import placement_from, placement_options
from aotforge.core.errors import InputSpecError


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--prompt-ids", help="Comma-separated prompt token ids, e.g. 1,2,3.")
@click.option(
    "--prompt",
    help="Prompt text (the artifact must carry its model's tokenizer files); one user turn of the model's chat "
    "template where the artifact carries one.",
)
@click.option(
    "--raw-prompt", is_flag=True, help="Feed --prompt as it is, not as a chat turn (for a completion, not an answer)."
)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--do-sample", is_flag=True, help="Sample instead of greedy decoding.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--seed", type=int, help="Seed of the sampler (reproducible sampling).")
@click.option(
    "--eos-token-id",
    type=int,
    help="Stop when this token is generated (default: the model's own end-of-sequence ids, from its generation "
    "config or tokenizer).",
)
@click.option("--ignore-eos", is_flag=True, help="Generate all --max-new-tokens, past the model's end-of-sequence.")
@click.option(
    "--draft",
    type=click.Path(path_type=Path),
    help="Speculative decoding: a smaller text-generation artifact (same vocabulary and tokenizer), or a feature "
    "draft directory of ARTIFACT's model, proposes tokens that ARTIFACT's verify graph (built with --speculative-k) "
    "checks.",
)
@click.option(
    "--num-speculative-tokens",
    type=click.IntRange(min=1),
    help="Draft tokens proposed per verify call (default: the artifact's --speculative-k).",
)
@click.option("--stats", is_flag=True, help="With --draft: print the draft's acceptance rate after the tokens.")
@placement_options
@user_errors
def generate(
    artifact: Path,
    prompt_ids: str | None,
    prompt: str | None,
    raw_prompt: bool,
    stats: bool,
    ignore_eos: bool,
    workers: str,
    ray_address: str | None,
    spread: str,
    **kw: object,
) -> None:
    """Generate tokens after a prompt with a text-generation ARTIFACT; prints the new token ids (and text).

    Stops at the model's own end-of-sequence ids unless --ignore-eos or --eos-token-id says otherwise."""
    import numpy as np

    from aotforge.artifacts.loader import load

    if (prompt_ids is None) == (prompt is None):
        raise click.BadParameter("give exactly one of --prompt-ids and --prompt", param_hint="--prompt-ids")
    tokenizer = _tokenizer(artifact) if prompt is not None else None
    if tokenizer is not None and prompt is not None:
        ids = _prompt_ids(tokenizer, prompt, chat=not raw_prompt)
    else:
        try:
            ids = [int(t) for t in str(prompt_ids).split(",") if t.strip()]
        except ValueError:
            raise click.BadParameter(
                f"{prompt_ids!r} is not comma-separated integers", param_hint="--prompt-ids"
            ) from None
    loaded = load(artifact, placement=placement_from(workers, spread, ray_address))
    stop = loaded.stop_token_ids(kw["eos_token_id"], ignore_eos)  # type: ignore[arg-type]
    if kw["draft"] is None:  # else a path: the call loads a draft artifact or a feature draft's directory
        del kw["draft"], kw["num_speculative_tokens"]
    new: list[int] = []
    for tokens in loaded.stream(np.array([ids], dtype=np.int64), ignore_eos=ignore_eos, **kw):  # type: ignore[arg-type]
        new.append(int(tokens[0]))
        click.echo(str(new[-1]), nl=False)
        click.echo(" ", nl=False)
    click.echo()
    if tokenizer is not None:
        click.echo(tokenizer.decode([t for t in new if t not in stop]))
    if stats and "draft" in kw:
        s = loaded.speculative_stats
        click.echo(
            f"speculative: {s['accepted']}/{s['proposed']} draft tokens accepted ({s['acceptance_rate']:.0%}), "
            f"{s['rounds']} verify calls for {len(new)} tokens"
        )


def _prompt_ids(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """``prompt`` as one user turn of the model's chat template (an instruct model answers it), or as it is
    where the model has no template or the user asks for the raw text."""
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return [
            int(t)
            for t in tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        ]
    return [int(t) for t in tokenizer(prompt)["input_ids"]]


def _tokenizer(artifact: Path) -> Any:
    if not (artifact / "tokenizer.json").is_file() and not (artifact / "tokenizer_config.json").is_file():
        raise InputSpecError(
            f"{artifact} carries no tokenizer files (the model directory had none): use --prompt-ids instead"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(artifact), local_files_only=True)


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--text-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Text, tokenized by the artifact's tokenizer.",
)
@click.option(
    "--ids-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Token ids instead: whitespace- or comma-separated integers.",
)
@click.option(
    "--window", type=click.IntRange(min=2), help="Tokens per window (default: the artifact's max_seq_len + 1)."
)
@click.option("--max-tokens", type=click.IntRange(min=2), help="Score only the first N tokens.")
@click.option("--max-perplexity", type=float, help="Exit with the validation status if the perplexity is above this.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def perplexity(
    artifact: Path,
    text_file: Path | None,
    ids_file: Path | None,
    window: int | None,
    max_tokens: int | None,
    max_perplexity: float | None,
    as_json: bool,
) -> None:
    """Perplexity of a text under a text-generation ARTIFACT (through its prefill and decode graphs).

    Score the same text with the fp32 artifact and a quantized one to gate the quantization."""
    import json

    import numpy as np

    from aotforge.artifacts.loader import load
    from aotforge.core.errors import ValidationFailedError

    if (text_file is None) == (ids_file is None):
        raise click.BadParameter("give exactly one of --text-file and --ids-file", param_hint="--text-file")
    if text_file is not None:
        text = _read_text(text_file, "--text-file")
        ids = list(_tokenizer(artifact)(text)["input_ids"])
    else:
        ids = _read_ids(Path(str(ids_file)))
    ids = ids[:max_tokens] if max_tokens else ids
    result = load(artifact).perplexity(np.array(ids, dtype=np.int64), window)
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True))
    else:
        click.echo(
            f"perplexity {result.perplexity:.4f} (mean NLL {result.nll:.4f} nats) over {result.scored_tokens} tokens "
            f"in {result.windows} windows of {result.window}, {result.seconds:.1f} s"
        )
    if max_perplexity is not None and result.perplexity > max_perplexity:
        raise ValidationFailedError(
            f"{artifact}: perplexity {result.perplexity:.4f} is above --max-perplexity {max_perplexity:g}"
        )


def _read_text(path: Path, option: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputSpecError(
            f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): give {option} a UTF-8 file"
        ) from e


def _read_ids(path: Path) -> list[int]:
    text = _read_text(path, "--ids-file").replace(",", " ")
    try:
        return [int(t) for t in text.split()]
    except ValueError:
        raise InputSpecError(f"{path} holds something other than integer token ids: use --text-file for text") from None
