"""MetaSchedule tuning for the ``tvm`` target: search what the store lacks or had less budget for, then apply.

``tune_module`` runs on the legalized, fused Relax module (before the default schedules), inside
nothing: it extracts one task per PrimFunc that has a reduction (matmul, conv, pooling, softmax
...: injective ops gain little from search), looks each one up in the content-addressed store
(``targets.tvm.tuning.store``) and searches the rest under a trial and a time budget. It returns
a MetaSchedule database holding only the entries whose best record beats the default schedule
on the same runner; ``apply_tuned`` marks those PrimFuncs scheduled, and the default rules
schedule everything else: a short search's best record often loses to the default rules, and applying
every record would slow the model down. ``tune_minutes`` is checked
after each measured batch, so the search may overrun it by one batch per task.

The trial budget is split evenly: each task may take ``trials // tasks`` (at least 1), counted over
every tunable task of the module whether or not the store has it, so the per-workload budget a
build asks for does not depend on what the store holds. An entry searched with less than that
(``Entry.covers``) is searched again for the difference, from a database seeded with its records
(the evolutionary search starts its population from a workload's best records), and the store
keeps the better records of both; the report counts tasks tuned fresh, re-tuned and re-used.

How candidates are built, timed and searched on a small host: ``targets.tvm.tuning.search``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from aotforge.targets.tvm.tuning import search as run
from aotforge.targets.tvm.tuning.store import TOP_K, Entry, TuningStore, digest, target_fields, workload_key


@dataclasses.dataclass(frozen=True)
class TuneSettings:
    """One tuning run: a total trial budget, an optional wall-clock cap, where results are kept."""

    #: 0 with ``minutes``: only the clock ends the search (up to ``MINUTES_ONLY_TRIALS`` per task), and
    #: entries already in the store are re-used as they are: there is no trial budget to compare.
    trials: int
    work_dir: Path
    #: The shared store; None keeps results in ``work_dir`` only (gone after the build).
    store_dir: Path | None = None
    minutes: float = 0.0
    seed: int = 0

    def per_task(self, tasks: int) -> int | None:
        """The trials each of ``tasks`` tasks may take; None: no trial budget (the clock only)."""
        return max(1, self.trials // max(1, tasks)) if self.trials > 0 else None


#: The per-task trial cap when only ``minutes`` is given: the clock ends the search first.
MINUTES_ONLY_TRIALS = 100_000


def _tunable(func: Any) -> bool:
    from tvm import s_tir
    from tvm.s_tir import dlight as dl

    try:
        infos = dl.normalize_prim_func(s_tir.Schedule(func))
    except Exception:  # a func dlight cannot normalise: let the search try it
        return True
    return infos is None or any(not b.is_injective() for b in infos)


def _entry_of(task: Any, key: str, database: Any, trials: int, default_secs: float | None) -> Entry | None:
    """The entry of one searched task from its best measured records (seeded ones too); None: none ran."""
    import tvm

    workload = database.commit_workload(task.dispatched[0])
    measured = (r for r in database.get_top_k(workload, TOP_K) if r.run_secs)
    records = sorted(measured, key=lambda r: run.seconds(r.run_secs))
    if not records:
        return None
    return Entry(
        key=key,
        workload=workload.as_json(),
        records=tuple(r.as_json() for r in records),
        run_secs=tuple(run.seconds(r.run_secs) for r in records),
        default_secs=default_secs,
        key_fields={"target": target_fields(task.target), "tvm": tvm.__version__},
        trials=trials,
    )


def tunable_tasks(mod: Any, target: Any) -> tuple[list[Any], list[str]]:
    """MetaSchedule's tasks for ``mod``'s PrimFuncs with a reduction, heaviest first, and their store keys."""
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    tasks = [t for t in ms.relax_integration.extract_tasks(mod, target) if _tunable(t.dispatched[0]["main"])]
    # Heaviest first: the task scheduler starts with them, so a clock that runs out cuts the light ones.
    tasks.sort(key=lambda t: -float(estimate_tir_flops(t.dispatched[0])) * t.weight)
    fields = target_fields(target)
    return tasks, [workload_key(tvm_ffi.structural_hash(t.dispatched[0]), fields, tvm.__version__) for t in tasks]


def _still_needed(keys: list[str], found: dict[str, Entry], settings: TuneSettings) -> dict[str, int]:
    """The trials each task is to be searched with now: a fresh one the whole per-task budget, an
    entry searched with less the difference. An old entry's unknown count decides by ``covers``
    (``LEGACY_TRIALS``) but counts 0 here, so what is recorded after is a count known to be spent."""
    if settings.trials <= 0 and settings.minutes <= 0:
        return {}
    budget = settings.per_task(len(keys))
    todo = {}
    for key in keys:
        old = found.get(key)
        if old is None:
            todo[key] = budget or MINUTES_ONLY_TRIALS
        elif budget is not None and not old.covers(budget):
            todo[key] = budget - (old.trials or 0)
    return todo


@dataclasses.dataclass(frozen=True)
class _Measure:
    """What times candidates in this build, and the default schedule of a task on it."""

    target: Any
    builder_runner: tuple[Any, Any]

    def default_secs(self, task: Any) -> float:
        return run.default_secs(task.dispatched[0], self.target, *self.builder_runner)


def _run_searches(
    pending: list[tuple[Any, str, int]],
    found: dict[str, Entry],
    store: TuningStore,
    settings: TuneSettings,
    ctx: _Measure,
) -> tuple[dict[str, Entry], int, int]:
    """Search ``pending`` (task, key, trials), one MetaSchedule run per distinct trial count, and
    merge each result into the store; the merged entries by key, trials run and failed."""
    deadline = time.monotonic() + settings.minutes * 60 if settings.minutes > 0 else None
    done: dict[str, Entry] = {}
    trials = failed = 0
    for need in sorted({n for _, _, n in pending}, reverse=True):
        if deadline is not None and time.monotonic() > deadline:
            break
        group = [(t, k) for t, k, n in pending if n == need]
        seeds = [found.get(k) for _, k in group]
        tasks = [t for t, _ in group]
        database, counter = run.search(
            tasks, seeds, need, deadline, settings.work_dir, settings.seed, ctx.builder_runner
        )
        trials, failed = trials + counter.trials, failed + counter.failed
        for i, ((task, key), old) in enumerate(zip(group, seeds, strict=True)):
            spent = counter.per_task.get(i, 0)
            if not spent:  # the clock ended the run before this task's first batch
                continue
            # Ran to its budget, or ended on its own (nothing left to try): it has had ``need`` trials.
            known = (old.trials or 0) if old is not None else 0
            had = known + (spent if i in counter.clock_stopped else need)
            entry = _entry_of(task, key, database, had, ctx.default_secs(task) if old is None else None)
            if entry is None and old is not None:  # nothing ran: keep the records, count the trials
                entry = dataclasses.replace(old, records=(), run_secs=(), default_secs=None, trials=had)
            if entry is not None:
                done[key] = store.merge(entry)
    return done, trials, failed


def tune_module(mod: Any, target: Any, settings: TuneSettings) -> tuple[Any, dict[str, Any]]:
    """The database to apply to ``mod`` (tuning what the store lacks or had less budget for first)
    and a report of it."""
    started = time.perf_counter()
    store = TuningStore(settings.store_dir or settings.work_dir / "tuning_store")
    tasks, keys = tunable_tasks(mod, target)
    found = {k: e for k in keys if (e := store.read(k)) is not None}
    todo = _still_needed(keys, found, settings)
    # Entries whose default schedule was never timed (written before it was): time it once now.
    untimed = [(t, k) for t, k in zip(tasks, keys, strict=True) if k in found and found[k].default_secs is None]
    done: dict[str, Entry] = {}
    trials = failed = 0
    if todo or untimed:
        ctx = _Measure(target, run.builder_runner())
        for task, key in untimed:
            timed = ctx.default_secs(task)
            found[key] = store.merge(dataclasses.replace(found[key], records=(), run_secs=(), default_secs=timed))
        pending = [(t, k, todo[k]) for t, k in zip(tasks, keys, strict=True) if k in todo]
        done, trials, failed = _run_searches(pending, found, store, settings, ctx)
    entries = [done.get(k) or found[k] for k in keys if k in done or k in found]
    used = [e for e in entries if e.beats_default]
    retuned = [k for k in done if k in found]
    report = {
        "store": str(settings.store_dir) if settings.store_dir else "work dir only (build with --cache-dir to keep it)",
        "database_digest": digest(used),
        "tasks": len(tasks),
        # Per task, exactly one of: tuned (fresh), retuned (bigger budget), reused (as stored), untuned.
        "tuned": len(done) - len(retuned),
        "retuned": len(retuned),
        "retuned_faster": sum(1 for k in retuned if done[k].run_secs[:1] < found[k].run_secs[:1]),
        "reused": len(found) - len(retuned),
        "untuned": len(tasks) - len(entries),
        "default_faster": len(entries) - len(used),
        "corrupt_entries": len(store.corrupt),
        "trials": trials,
        "failed_trials": failed,
        "trial_budget": settings.trials,
        "trials_per_task": settings.per_task(len(tasks)),
        "minutes_budget": settings.minutes,
        "tuning_seconds": round(time.perf_counter() - started, 2),
    }
    return run.entries_database(used), report


def apply_tuned(mod: Any, database: Any) -> tuple[Any, int]:
    """``mod`` with the database's schedules applied (inside ``with target:``); how many PrimFuncs got one."""
    from tvm import relax, tirx

    def scheduled(m: Any) -> int:
        return sum(
            1
            for _, f in m.functions_items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and int(f.attrs.get("tirx.is_scheduled", 0)) == 1
        )

    before = scheduled(mod)
    with database:
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    return mod, scheduled(mod) - before
