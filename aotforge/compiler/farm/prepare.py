"""The frontend and the target-independent passes once, then one build bundle per target.

Targets whose pass defaults agree (every CPU target; TensorRT differs for int8) share one run of the
passes and so one IR; a target with other defaults gets its own copy of the IR before the passes.
A target that cannot take the build (unknown, bad options, refused by its plan, no bundle possible)
fails its own row with the reason; the others go on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from aotforge.artifacts.names import safe_name
from aotforge.artifacts.store import next_version
from aotforge.compiler.build_plan import PlannedBuild
from aotforge.compiler.builder import LoadedSource, build_context, load_and_sample, target_passes
from aotforge.compiler.bundle import prepare_bundle
from aotforge.compiler.options import BuildOptions
from aotforge.core.errors import AotforgeError
from aotforge.core.options import options_from_dict
from aotforge.passes.manager import run_passes
from aotforge.targets import TARGETS, get_target
from aotforge.targets.base import ProbeResult, Target

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One model's bundles: per target the bundle (and its IR's sha256), or why it has none."""

    name: str
    version: int
    bundles: dict[str, Path]
    ir_sha256: dict[str, str]
    failed: dict[str, str]
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "bundles": {t: str(p) for t, p in self.bundles.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Prepared:
        return cls(**{**data, "bundles": {t: Path(p) for t, p in data["bundles"].items()}})


def options_per_target(options: Mapping[str, Any], targets: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Target options by target: ``tvm.mcpu=...`` or a ``{"tvm": {...}}`` table for one, a plain key for all."""
    per: dict[str, dict[str, Any]] = {t: {} for t in targets}
    for key, value in options.items():
        if key in TARGETS and isinstance(value, Mapping):
            per.get(key, {}).update(value)
            continue
        name, dot, field = key.partition(".")
        if dot and name in TARGETS:
            per.get(name, {})[field] = value
        else:
            for t in targets:
                per[t][key] = value
    return per


@dataclasses.dataclass(frozen=True)
class _Plan:
    target: Target
    options: Any
    pass_names: tuple[str, ...]
    passes: list[Any]
    group: str


def prepare(
    model: Any,
    opts: BuildOptions,
    targets: Sequence[str],
    bundle_root: Path,
    *,
    example_inputs: Mapping[str, Any] | None = None,
    probe_here: bool = True,
    progress: Progress | None = None,
) -> Prepared:
    """Bundles for ``targets`` under ``bundle_root``; the artifact name and one version for all of them.

    ``probe_here``: a target whose probe fails on this host fails its row now (local builds); a farm
    whose workers have other SDKs than this host leaves the probe to the worker.
    """
    import time

    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    failed: dict[str, str] = {}
    plans = _plan_targets(opts, targets, probe_here, failed)
    if not plans:
        return Prepared(opts.name or "", opts.version or 0, {}, {}, failed)
    loaded = load_and_sample(model, opts, example_inputs, say)
    name = opts.name or safe_name(loaded.source.name)
    version = opts.version or next_version(opts.out, name)
    bundles: dict[str, Path] = {}
    ir_sha: dict[str, str] = {}
    groups: dict[str, list[str]] = {}
    for t, p in plans.items():
        groups.setdefault(p.group, []).append(t)
    # Copies before the first group's passes change the IR in place.
    models = [loaded.source.ir] + [_copy(loaded.source.ir) for _ in list(groups)[1:]]
    for model_ir, members in zip(models, groups.values(), strict=True):
        members = [t for t in members if _planned(plans[t], model_ir, loaded, failed, t)]
        if not members:
            continue
        first = plans[members[0]]
        say(f"running passes for {', '.join(members)}: {', '.join(first.pass_names) or 'none'}")
        records = run_passes(model_ir, first.passes, opts.passes.dump_ir)
        source = dataclasses.replace(loaded.source, ir=model_ir)
        for t in members:
            p = plans[t]
            planned = PlannedBuild(
                source, p.target, p.target.probe() if probe_here else _NO_PROBE, p.options,
                build_context(loaded, p.pass_names), loaded.samples, loaded.sizes, records, loaded.record,
            )  # fmt: skip
            t_opts = dataclasses.replace(opts, target=t, out=bundle_root, version=version, prepare_only=True)
            try:
                result = prepare_bundle(planned, t_opts, name)
            except AotforgeError as e:
                failed[t] = str(e)
                continue
            bundles[t], ir_sha[t] = result.path, str(result.manifest.ir["sha256"])
    return Prepared(name, version, bundles, ir_sha, failed, round(time.perf_counter() - started, 2))


def _plan_targets(opts: BuildOptions, targets: Sequence[str], probe_here: bool, failed: dict[str, str]) -> dict:
    """Each target's options and passes, checked before the frontend runs (a bad option costs nothing)."""
    plans: dict[str, _Plan] = {}
    per = options_per_target(opts.target_options, targets)
    for t in targets:
        try:
            target = get_target(t)
            if probe_here and not (probe := target.probe()).compiles:
                failed[t] = f"target {t} is not available on this host: {probe.reason}"
                continue
            options = options_from_dict(target.options_type, per[t], what=t)
            pass_names, passes = target_passes(dataclasses.replace(opts, target=t), target)
        except AotforgeError as e:
            failed[t] = str(e)
            continue
        defaults = {n: target.pass_defaults[n] for n in pass_names if n in target.pass_defaults}
        group = json.dumps([pass_names, defaults], sort_keys=True, default=str)
        plans[t] = _Plan(target, options, pass_names, passes, group)
    return plans


def _planned(plan: _Plan, model_ir: ir.Model, loaded: LoadedSource, failed: dict[str, str], t: str) -> bool:
    try:
        plan.target.plan(model_ir, plan.options, build_context(loaded, plan.pass_names))
    except AotforgeError as e:
        failed[t] = str(e)
        return False
    return True


def _copy(model: ir.Model) -> ir.Model:
    """An independent copy of the IR (weights read into memory first: the copy must not share files)."""
    import onnx_ir.external_data

    return ir.from_proto(ir.to_proto(onnx_ir.external_data.load_to_model(model)))


_NO_PROBE = ProbeResult(False, "not probed on the preparing host (the worker probes)")
