"""``aotforge matrix``: run a plan's models x targets on an executor, skipping what is already built.

A model's frontend and passes run once in a local worker (``kind = "prepare"``), which writes one
bundle per target; each bundle is then finished by the executor (a local worker, or a Ray task on a
node with the target's device). A finished (model, target) is recorded under ``OUT/.matrix/``: its
key covers the model's bytes, the entry's options, aotforge's own source and the installed
distributions, so re-running a finished plan builds nothing (its artifacts are re-verified).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, as_completed
from pathlib import Path
from typing import Any, Protocol

from aotforge.artifacts.debris import make_temp_dir, make_temp_file, sweep
from aotforge.artifacts.hashing import require_intact, sha256_file
from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.build_direct import aotforge_source_digest, toolchain_fingerprint
from aotforge.compiler.farm import report
from aotforge.compiler.farm.executors import LocalExecutor
from aotforge.compiler.farm.multi import WORK_PREFIX, finish_job
from aotforge.compiler.farm.plan import Entry, Plan
from aotforge.compiler.farm.spec import MatrixResult
from aotforge.core.errors import AotforgeError

Progress = Callable[[str], None]
STATE_DIR = ".matrix"


class Executor(Protocol):
    name: str

    def submit(self, job: dict[str, Any], work: Path, tag: str) -> Future[dict[str, Any]]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def run_plan(
    plan: Plan, out: Path, executor: Executor, *, local: LocalExecutor, progress: Progress | None = None
) -> MatrixResult:
    """Build every entry x target not already built; one summary in ``out``. ``local`` runs the prepares."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    sweep(out, WORK_PREFIX)
    state = _State(out)
    toolchain = {"aotforge": aotforge_source_digest(), "distributions": toolchain_fingerprint()["distributions"]}
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    work = make_temp_dir(out, WORK_PREFIX)
    prepares: dict[Future[dict[str, Any]], tuple[int, Entry, dict[str, str]]] = {}
    try:
        for i, entry in enumerate(plan.entries):
            try:
                keys = {t: entry.key(t, toolchain) for t in entry.targets}
            except AotforgeError as e:  # an unreadable model fails its entry; the plan goes on
                rows.update({(i, t): report.failed_row(Path(entry.model).stem, t, str(e)) for t in entry.targets})
                continue
            todo = {t: k for t, k in keys.items() if not _cached(state, k, i, entry, t, rows)}
            if todo:
                job = _prepare_job(entry, list(todo), out, plan, work / f"m{i}")
                prepares[local.submit(job, work, f"m{i}.prepare")] = (i, entry, todo)
        say(f"{len(prepares)} model(s) to prepare, {len(rows)} build(s) already done")
        builds = _finish_all(prepares, executor, plan, out, work, rows, say)
        for future in as_completed(builds):
            i, entry, target, key = builds[future]
            rows[(i, target)] = _built(future, entry, target, key, state, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ordered = [rows[(i, t)] for i, e in enumerate(plan.entries) for t in e.targets if (i, t) in rows]
    agreements = _agreement(ordered, state)
    if plan.push:
        _push(ordered, plan.push, say)
    summary = {
        "plan": str(plan.path),
        "rows": ordered,
        "agreement": agreements,
        "executor": executor.describe(),
        "seconds": round(time.perf_counter() - started, 2),
    }
    return MatrixResult(ordered, agreements, report.write(out, summary))


def _finish_all(
    prepares: dict, executor: Executor, plan: Plan, out: Path, work: Path, rows: dict, say: Progress
) -> dict[Future[dict[str, Any]], tuple[int, Entry, str, str]]:
    """As each model's bundles are ready, hand every target's bundle to the executor."""
    builds: dict[Future[dict[str, Any]], tuple[int, Entry, str, str]] = {}
    for future in as_completed(prepares):
        i, entry, todo = prepares[future]
        result = future.result()
        if "ok" not in result:
            for target in todo:
                rows[(i, target)] = report.failed_row(Path(entry.model).stem, target, result["message"])
            continue
        prep = result["ok"]
        for target, why in prep["failed"].items():
            rows[(i, target)] = report.failed_row(prep["name"] or Path(entry.model).stem, target, why)
        say(f"{prep['name']}: frontend and passes done in {prep['seconds']} s; building {', '.join(prep['bundles'])}")
        for target, bundle in prep["bundles"].items():
            job = finish_job(
                Path(bundle), out, work / f"m{i}.{target}.outputs.npz", plan.cache_dir, entry.options["bench"]
            )
            job.update(model=prep["name"], version=prep["version"], resources=entry.resources_for(target))
            builds[executor.submit(job, work, f"m{i}.{target}")] = (i, entry, target, todo[target])
    return builds


def _prepare_job(entry: Entry, targets: list[str], out: Path, plan: Plan, bundle_root: Path) -> dict[str, Any]:
    options = {**entry.options, "out": str(out), "cache_dir": str(plan.cache_dir) if plan.cache_dir else None}
    return {
        "kind": "prepare",
        "model": entry.model,
        "options": options,
        "targets": targets,
        "bundle_root": str(bundle_root),
        # The Ray workers may hold SDKs this host lacks: they probe; a local farm probes here.
        "probe_here": False,
    }


def _built(future: Future[dict[str, Any]], entry: Entry, target: str, key: str, state: _State, work: Path) -> dict:
    name = Path(entry.model).stem
    try:
        result = future.result()
    except Exception as e:  # the executor itself failed (a Ray error): this row, not the plan
        return report.failed_row(name, target, f"{type(e).__name__}: {e}")
    if "ok" not in result:
        return report.failed_row(name, target, result["message"])
    done = result["ok"]
    path = Path(done["path"])
    row = report.artifact_row(done["manifest"]["name"], target, path, done["manifest"], cached=False)
    state.record(key, path, Path(done["outputs"]))
    return row


def _cached(state: _State, key: str, i: int, entry: Entry, target: str, rows: dict) -> bool:
    path = state.artifact(key)
    if path is None:
        return False
    manifest = read_manifest(path)
    rows[(i, target)] = report.artifact_row(manifest.name, target, path, manifest.to_dict(), cached=True)
    return True


def _agreement(rows: list[dict[str, Any]], state: _State) -> dict[str, dict[str, float]]:
    by_model: dict[str, dict[str, Path]] = {}
    for row in rows:
        if row["status"] != "failed":
            outputs = state.outputs_of(Path(row["path"]))
            if outputs is not None:
                by_model.setdefault(row["model"], {})[row["target"]] = outputs
    agreements = {model: report.agreement(outputs) for model, outputs in by_model.items()}
    for model, pairs in agreements.items():
        report.fill_agreement([r for r in rows if r["model"] == model], pairs)
    return agreements


def _push(rows: list[dict[str, Any]], registry: str, say: Progress) -> None:
    from aotforge.artifacts.registry import open_registry

    reg = open_registry(registry, create=True)
    for row in rows:
        if row["status"] == "failed":
            continue
        try:
            name, version = reg.push(Path(row["path"]))
            row["pushed"] = f"{name}:{version}"
        except AotforgeError as e:
            row["pushed"] = f"failed: {e}"
        say(f"push {row['model']}/{row['target']}: {row['pushed']}")


class _State:
    """``OUT/.matrix/``: which key built which artifact (by its manifest's sha256), and its outputs."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.root = out / STATE_DIR
        (self.root / "outputs").mkdir(parents=True, exist_ok=True)
        self.index = self.root / "index.json"
        self.entries: dict[str, dict[str, str]] = json.loads(self.index.read_text()) if self.index.is_file() else {}

    def artifact(self, key: str) -> Path | None:
        """The artifact built for ``key``, if it is still there and intact."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        path = self.out / entry["path"]
        try:
            if sha256_file(path / "manifest.json") != entry["manifest_sha256"]:
                return None
            require_intact(path, read_manifest(path))
        except (OSError, AotforgeError):
            return None
        return path

    def outputs_of(self, path: Path) -> Path | None:
        rel = path.resolve().relative_to(self.out.resolve()).as_posix()
        for key, entry in self.entries.items():
            if entry["path"] == rel:
                stored = self.root / "outputs" / f"{key}.npz"
                return stored if stored.is_file() else None
        return None

    def record(self, key: str, path: Path, outputs: Path) -> None:
        shutil.copyfile(outputs, self.root / "outputs" / f"{key}.npz")
        rel = path.resolve().relative_to(self.out.resolve()).as_posix()
        self.entries[key] = {"path": rel, "manifest_sha256": sha256_file(path / "manifest.json")}
        tmp = make_temp_file(self.root, ".index-")
        tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
        tmp.replace(self.index)
