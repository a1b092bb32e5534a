"""Load an artifact anywhere its target runs: verify every file first, then hand over a runner."""

from __future__ import annotations

import functools
import os
import platform
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.debris import make_temp_dir, sweep
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.model_defaults import eos_token_ids
from aotforge.artifacts.signing import verified_manifest
from aotforge.core.decoder import DRAFT_VOCAB_FILE, TEXT_GENERATION, TOKENIZER_FILES
from aotforge.core.errors import DraftMismatchError, HostMismatchError, InputSpecError, OptionsError
from aotforge.core.placement import Placement, Workers
from aotforge.core.spec import IOSpec
from aotforge.targets import get_target
from aotforge.targets.base import Runner, Target
from aotforge.targets.generative import generative_backend
from aotforge.targets.generative.decoding import StopIds, stop_ids

Arrays = dict[str, np.ndarray]
_PULL_PREFIX = "pull-"


class LoadedArtifact:
    """A verified artifact and its target's runner. ``run`` checks input names and dtypes first."""

    def __init__(self, path: Path, manifest: Manifest, runner: Runner) -> None:
        self.path = path
        self.manifest = manifest
        self.io = IOSpec.from_dict(manifest.io)
        self._runner = runner
        #: The last feature draft passed as a directory, by (path, its config's mtime): loaded once for the calls
        #: that pass it again (its int8 step is built on first use); one only, as a draft holds its weights.
        self._feature_draft: tuple[tuple[str, int], Any] | None = None

    def run(self, inputs: Mapping[str, np.ndarray]) -> Arrays:
        expected = [s.name for s in self.io.inputs]
        if sorted(inputs) != sorted(expected):
            raise InputSpecError(
                f"inputs {sorted(inputs)} do not match the artifact's {expected}: pass exactly those names"
            )
        ordered = {}
        for spec in self.io.inputs:
            value = np.asarray(inputs[spec.name])
            if value.dtype != np.dtype(spec.dtype):
                raise InputSpecError(f"input {spec.name!r} is {value.dtype}, the artifact expects {spec.dtype}")
            ordered[spec.name] = value
        # Every target: a shape outside the declared ranges gets one error naming them.
        self.io.sizes_of({k: v.shape for k, v in ordered.items()}, who=f"{self.manifest.target.name} artifact")
        return self._runner.run(ordered)

    def generate(
        self,
        input_ids: np.ndarray,
        max_new_tokens: int,
        *,
        eos_token_id: StopIds = None,
        ignore_eos: bool = False,
        **kwargs: Any,
    ) -> np.ndarray:
        """``[batch, prompt + new tokens]``: each prompt, then at most ``max_new_tokens`` decoded after it (a
        text-generation artifact; keywords as its runner's: ``attention_mask``, ``do_sample``, ``temperature``,
        ``top_k``, ``top_p``, ``seed``).

        A row stops at the model's own end-of-sequence ids (:attr:`eos_token_ids`) and repeats the id it stopped at
        until every row has stopped, where the call ends. ``eos_token_id=`` (an id or several) stops at those
        instead; ``ignore_eos=True`` runs every row to ``max_new_tokens`` past the model's ids (as serving's
        ``SamplingParams.ignore_eos``: ids given as ``eos_token_id`` still stop).

        ``draft=`` (a loaded text-generation artifact or its path) with ``num_speculative_tokens=k``:
        speculative decoding, this artifact's verify graph checking the draft's proposals; the draft
        must have this artifact's vocabulary and tokenizer files (refused by name otherwise). A feature draft
        (``targets.generative.feature_draft``: loaded, or its directory) proposes from this artifact's own
        hidden state instead; it must be made for this artifact's model (hidden size and vocabulary).

        Runs on the serving runtime's engine (``aotforge.runtime.offline``, a floor above, imported when called), so
        offline and served generation are one path."""
        from aotforge.runtime import offline

        runner = self._generative()  # refused first: a model of another task has no end-of-sequence ids to look up
        return offline.generate(runner, input_ids, max_new_tokens, **self._decoding(kwargs, eos_token_id, ignore_eos))

    def stream(
        self,
        input_ids: np.ndarray,
        max_new_tokens: int,
        *,
        eos_token_id: StopIds = None,
        ignore_eos: bool = False,
        **kwargs: Any,
    ) -> Iterator[np.ndarray]:
        """Each step's new tokens ``[batch]`` as they are decoded (a text-generation artifact; as ``generate``,
        stopping where it stops)."""
        from aotforge.runtime import offline

        runner = self._generative()  # refused first: a model of another task has no end-of-sequence ids to look up
        return offline.stream(runner, input_ids, max_new_tokens, **self._decoding(kwargs, eos_token_id, ignore_eos))

    @functools.cached_property
    def eos_token_ids(self) -> frozenset[int]:
        """The model's own end-of-sequence ids, where ``generate()`` stops by default: its generation config's
        (``generation_config.json``, carried by the build), else its tokenizer's; empty when it carries neither."""
        return frozenset(eos_token_ids(self.path))

    def stop_token_ids(self, eos_token_id: StopIds = None, ignore_eos: bool = False) -> frozenset[int]:
        """The ids a ``generate()`` call with these arguments stops at."""
        if eos_token_id is not None:
            return stop_ids(eos_token_id)
        return frozenset() if ignore_eos else self.eos_token_ids

    def _decoding(self, kwargs: dict[str, Any], eos_token_id: StopIds, ignore_eos: bool) -> dict[str, Any]:
        """The runner's keywords for a call: the draft loaded and checked, the stop ids resolved."""
        return {**self._with_draft(kwargs), "eos_token_id": self.stop_token_ids(eos_token_id, ignore_eos)}

    @property
    def speculative_stats(self) -> dict[str, Any]:
        """The last speculative call's draft tokens proposed / accepted, acceptance rate, rounds."""
        return dict(getattr(self._generative(), "speculative_stats", {}))

    def _with_draft(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        draft = kwargs.get("draft")
        if draft is None:
            return kwargs
        from aotforge.targets.generative.feature_draft import (
            CONFIG_FILE,
            FeatureDraft,
            is_feature_draft,
            load_feature_draft,
        )

        if is_feature_draft(draft):  # a feature draft's directory (checked against the target when the call starts)
            path = Path(draft).resolve()
            key = (str(path), (path / CONFIG_FILE).stat().st_mtime_ns)  # written last, by save_feature_draft
            if self._feature_draft is None or self._feature_draft[0] != key:
                self._feature_draft = (key, load_feature_draft(path))
            draft = self._feature_draft[1]
        if isinstance(draft, FeatureDraft):
            return {**kwargs, "draft": draft}
        if not isinstance(draft, LoadedArtifact):
            draft = load(draft)
        check_draft(self.manifest, draft.manifest)
        runner = draft._generative()
        if DRAFT_VOCAB_FILE in draft.manifest.files:  # a draft over a subset of this vocabulary
            from aotforge.targets.generative.draft_vocab import sub_vocab_runner

            vocab = int(self.manifest.target.info["decoder"]["vocab"])
            runner = sub_vocab_runner(runner, draft.path / DRAFT_VOCAB_FILE, vocab)
        return {**kwargs, "draft": runner}

    def perplexity(self, input_ids: np.ndarray, window: int | None = None) -> Any:
        """Perplexity of token ids under the artifact (a text-generation artifact; ``generative.perplexity``).

        Still on the target's step engine: it scores every position of fixed batches of whole windows, and the
        runtime's engine returns sampled tokens, not the logits of each position."""
        return self._generative().perplexity(input_ids, window)

    def _generative(self) -> Any:
        if not hasattr(self._runner, "generate"):
            raise InputSpecError(
                f"{self.manifest.name} v{self.manifest.version} is not a text-generation artifact: use run(), "
                "or build the causal LM with --task text-generation"
            )
        return self._runner


def check_draft(target: Manifest, draft: Manifest) -> None:
    """Refuse, before any token, a draft whose vocabulary or tokenizer files differ from the target's."""
    who = f"draft {draft.name} v{draft.version}"
    if draft.target.info.get("task") != TEXT_GENERATION:
        raise DraftMismatchError(
            f"{who} is not a text-generation artifact: build the draft with --task text-generation"
        )
    vocab = (target.target.info["decoder"]["vocab"], draft.target.info["decoder"]["vocab"])
    if vocab[0] != vocab[1] and (vocab[1] > vocab[0] or DRAFT_VOCAB_FILE not in draft.files):
        raise DraftMismatchError(
            f"{who} has a vocabulary of {vocab[1]} tokens, target {target.name} v{target.version} has {vocab[0]}: "
            "the draft must share the target's vocabulary and tokenizer (or be a subset of it that carries "
            f"{DRAFT_VOCAB_FILE}: `aotforge distill --draft-vocab N`)"
        )
    differ = sorted(
        f
        for f in TOKENIZER_FILES
        if (f in target.files or f in draft.files) and target.files.get(f) != draft.files.get(f)
    )
    if differ:
        raise DraftMismatchError(
            f"{who} and target {target.name} v{target.version} differ in tokenizer file(s) {', '.join(differ)} "
            "(missing in one, or different bytes): the draft must share the target's tokenizer"
        )


def load(
    path: str | Path,
    public_key: str | Path | None = None,
    *,
    registry: Any = None,
    manifest_sha256: str | None = None,
    placement: Placement | None = None,
) -> LoadedArtifact:
    """Verify the artifact at ``path`` and load it for its target.

    With ``registry`` (a local directory, an ``http(s)://`` MLflow URI or a registry object),
    ``path`` is a reference, ``NAME:VERSION`` or ``NAME@ALIAS``, pulled (and hash-checked) into
    ``$AOTFORGE_PULL_CACHE`` (default ``~/.cache/aotforge/pulled``) once per registry digest.
    Before anything is deserialized or dlopened: the signature when ``public_key`` is given (an
    unsigned artifact is then refused), every file's sha256, and this host against the toolchain
    and host the manifest says it was built with and for. ``manifest_sha256`` (printed by ``compile``;
    from a registry, its digest is used) covers the manifest itself, so an edit to it is refused too.
    ``placement`` says where a pipeline-parallel artifact's stages or a tensor-parallel one's ranks run (default: a
    process each on this host).
    """
    if registry is not None:
        path, manifest_sha256 = pull_cached(str(path), registry)
    path = Path(path)
    manifest = verified_manifest(path, public_key, manifest_sha256=manifest_sha256)
    target = get_target(manifest.target.name)
    check_host(manifest, target)
    if placement is not None and placement.workers is not Workers.PROCESSES:
        _check_placement(manifest, placement)
    if "tensor_parallel" in manifest.target.info:  # rank graphs, a process each
        from aotforge.targets.generative.ranks import load_ranked

        runner: Runner = load_ranked(path, manifest.target, placement or Placement())
    elif "pipeline_parallel" in manifest.target.info:  # stage graphs, a process each
        from aotforge.targets.generative.stages import load_staged

        runner = load_staged(path, manifest.target, placement or Placement())
    elif manifest.target.info.get("task") == TEXT_GENERATION:  # prefill + decode graphs, not one model
        runner = generative_backend(manifest.target.name).load(path, manifest.target)
    else:
        runner = target.load(path, manifest.target, IOSpec.from_dict(manifest.io))
    return LoadedArtifact(path, manifest, runner)


def _check_placement(manifest: Manifest, placement: Placement) -> None:
    """Refuse workers elsewhere than this host for an artifact whose parts cannot run there."""
    who = f"{manifest.name} v{manifest.version}"
    if "pipeline_parallel" not in manifest.target.info and "tensor_parallel" not in manifest.target.info:
        raise OptionsError(
            f"{who} is one model in one process: --workers {placement.workers.value} places the stages of a "
            "pipeline-parallel artifact or the ranks of a tensor-parallel one (build with --pipeline-parallel N or "
            "--tensor-parallel N); for copies of it use serve --replicas"
        )


def check_host(manifest: Manifest, target: Target) -> None:
    """Refuse, before the target loads anything, an artifact built for another OS/arch or toolchain.

    The generic part reads ``target.info.platform`` (recorded by targets whose files are native
    code); the target's own ``check_host`` checks versions and CPU features.
    """
    built = manifest.target.info.get("platform")
    if built:
        here = {"system": platform.system(), "machine": platform.machine()}
        if (built.get("system"), built.get("machine")) != (here["system"], here["machine"]):
            raise HostMismatchError(
                f"{manifest.name} v{manifest.version} was built with {manifest.target.name} for "
                f"{built.get('system')}/{built.get('machine')}, this host is {here['system']}/{here['machine']}: "
                f"rebuild it on or for this host, or run it on a {built.get('system')}/{built.get('machine')} host"
            )
    target.check_host(manifest)


def pull_cached(ref: str, registry: Any) -> tuple[Path, str]:
    """The artifact ``ref`` from ``registry``, pulled once per digest, and that digest (its manifest's
    sha256); a concurrent pull of it is harmless."""
    from aotforge.artifacts.registry import open_registry

    reg = open_registry(registry, create=False)
    entry = reg.resolve(ref)
    cache = Path(os.environ.get("AOTFORGE_PULL_CACHE", "~/.cache/aotforge/pulled")).expanduser()
    final = cache / entry.digest
    if final.is_dir():
        return final, entry.digest  # load() re-verifies every hash, the manifest's too, before using it
    cache.mkdir(parents=True, exist_ok=True)
    sweep(cache, _PULL_PREFIX)  # what killed loads left
    tmp = make_temp_dir(cache, _PULL_PREFIX)
    try:
        pulled = reg.pull(entry.ref, tmp / "artifact")
        try:
            os.rename(pulled, final)
        except OSError:
            if not final.is_dir():  # lost a race to another pull of the same digest otherwise
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, entry.digest
