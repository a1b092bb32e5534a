"""``aotforge finish``: the bundle read and checked, then finished by its kind's path (a text-generation bundle,
sharded or not, here; a model's through ``compiler.bundle.finish``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.bundle_format import read_bundle
from aotforge.compiler.generative.bundle_finish import finish_generative
from aotforge.compiler.generative.sharded_bundle import finish_sharded
from aotforge.compiler.isolation import Isolation
from aotforge.core.decoder import TEXT_GENERATION
from aotforge.core.errors import OptionsError

Progress = Callable[[str], None]


def finish_bundle(
    path: Path,
    out: Path,
    *,
    target_name: str | None = None,
    bench: bool | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    isolation: Isolation | None = None,
) -> BuildResult:
    """``aotforge finish``: a text-generation bundle (sharded or not) here, any other through
    ``compiler.bundle.finish``.
    ``isolation``: where the compile and the validation runs happen (default: a spawned worker, as ``build``'s)."""
    data = read_bundle(path)
    if data.get("task") == TEXT_GENERATION:
        if isolation is not None and isolation.run_deadline_s != Isolation.run_deadline_s:
            raise OptionsError(
                "--run-deadline does not apply to a text-generation bundle (its greedy tokens are validated in this "
                "process, against the references the bundle carries): drop it"
            )
        finish = finish_sharded if "shards" in data else finish_generative
        return finish(
            path,
            data,
            out,
            target_name=target_name,
            bench=bench,
            progress=progress,
            cache_dir=cache_dir,
            isolation=isolation,
        )
    from aotforge.compiler.bundle import finish as finish_model

    return finish_model(
        path, out, target_name=target_name, bench=bench, cache_dir=cache_dir, progress=progress, isolation=isolation
    )
