"""MetaSchedule tuning for the ``tvm`` target: search what the store lacks or had less budget for, then apply.

``tune_module`` runs on the legalized, fused Relax module (before the default schedules), inside
nothing: it extracts one task per PrimFunc that has a reduction (matmul, conv, pooling, softmax
...: injective ops gain little from search), looks each one up in the content-addressed store
(``targets.tvm_tuning_store``) and searches the rest under a trial and a time budget. It returns
a MetaSchedule database holding only the entries whose best record beats the default schedule
on the same runner; ``apply_tuned`` marks those PrimFuncs scheduled, and the default rules
schedule everything else. (Measured on mini_resnet with 132 trials over 11 tasks, the default
rules won 10 of 11: applying every record made the model 4x slower.) ``tune_minutes`` is checked
after each measured batch, so the search may overrun it by one batch per task.

The trial budget is split evenly: each task may take ``trials // tasks`` (at least 1), counted over
every tunable task of the module whether or not the store has it, so the per-workload budget a
build asks for does not depend on what the store holds. An entry searched with less than that
(``Entry.covers``) is searched again for the difference, from a database seeded with its records
(the evolutionary search starts its population from a workload's best records), and the store
keeps the better records of both; the report counts tasks tuned fresh, re-tuned and re-used.

Candidates are built in this process: the stock ``LocalBuilder`` starts a fresh worker for every
batch, and each worker spends ~30 s importing TVM's tensor intrinsics (measured on a 2-core host:
40 s to build two tiny kernels), which also made its 30 s timeout kill most builds. They still
run in a separate process (``LocalRunner``), so a crashing candidate cannot take the build down.
The cost model is xgboost (``pip install xgboost-cpu``: plain ``xgboost`` pulls ~470 MB of NVIDIA
libraries).
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from compiler.errors import CompileError
from targets.tvm_tuning_store import DEFAULT_FAILED, TOP_K, Entry, TuningStore, digest, target_fields, workload_key


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


def _budget_callback(deadline: float | None) -> Any:
    """Counts trials (per task too); past ``deadline`` (monotonic seconds) it ends every task still tuning."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class _Budget(PyMeasureCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.trials = 0
            self.failed = 0
            self.per_task: dict[int, int] = {}
            #: Tasks the clock ended before their budget: their count, not the budget, is what they had.
            self.clock_stopped: set[int] = set()

        def apply(self, scheduler: Any, task_id: int, candidates: Any, builds: Any, runs: Any) -> None:
            self.trials += len(runs)
            self.per_task[task_id] = self.per_task.get(task_id, 0) + len(runs)
            self.failed += sum(1 for b, r in zip(builds, runs, strict=True) if b.error_msg or r.error_msg)
            if deadline is not None and time.monotonic() > deadline:
                for i, record in enumerate(scheduler.tasks_):
                    if not record.is_terminated:
                        self.clock_stopped.add(i)
                        scheduler.terminate_task(i)

    return _Budget()


def _in_process_builder() -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

    @derived_object
    class _Builder(PyBuilder):  # type: ignore[misc]
        def build(self, build_inputs: list[Any]) -> list[Any]:
            results = []
            for item in build_inputs:
                try:
                    results.append(BuilderResult(default_export(default_build(item.mod, item.target, None)), None))
                except Exception as e:  # an invalid candidate: the search records it as failed
                    results.append(BuilderResult(None, f"build failed: {e}"))
            return results

    return _Builder()


def _builder_runner() -> tuple[Any, Any]:
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner

    builder = _in_process_builder()
    runner = LocalRunner(timeout_sec=60, evaluator_config=EvaluatorConfig(number=3, repeat=3, min_repeat_ms=40))
    return builder, runner


def _import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (every TuneContext does) without a minute of ``inspect``.

    Each of their ~500 TVMScript functions calls ``inspect.stack()``, which looks up the module of
    every frame; the frozen importlib frames of the import have no file, so each lookup scans all
    of ``sys.modules`` (measured: 39 s with only TVM loaded, 110-130 s inside a build with torch
    loaded). Naming those frames' modules in ``inspect``'s own cache makes it ~10 s.
    """
    import inspect

    for name in ("importlib._bootstrap", "importlib._bootstrap_external"):
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)
    import tvm.s_tir.tensor_intrin  # noqa: F401


def _search(
    tasks: list[Any],
    seeds: list[Entry | None],
    per_task: int,
    deadline: float | None,
    settings: TuneSettings,
    builder_runner: tuple[Any, Any],
) -> tuple[Any, Any]:
    """MetaSchedule's evolutionary search, ``per_task`` trials for each task, from a database
    seeded with ``seeds`` (the store's entry of each task, where it has one); the database and counter."""
    from tvm.s_tir import meta_schedule as ms

    try:
        import xgboost  # noqa: F401
    except ImportError as e:
        raise CompileError(
            f"tvm tuning needs the xgboost cost model ({e}): pip install xgboost-cpu, or build with tune_trials=0"
        ) from e
    _import_tensor_intrinsics()
    counter = _budget_callback(deadline)
    # Small batches spread a small budget over every task; the stock 64 gives it all to the first.
    per_iter = max(2, min(64, per_task))
    # The stock population (512, evolved 4 times per batch) costs ~1 min of search per batch on a
    # 2-core host, more than building and timing the batch: scale it with the batch instead.
    population = max(64, min(512, 16 * per_iter))
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population // 4)
    )
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, work_dir=str(settings.work_dir), strategy=strategy, seed=settings.seed
    )
    database = _apply_database([e for e in seeds if e is not None])
    builder, runner = builder_runner
    ms.tune.tune_tasks(
        tasks=contexts,
        task_weights=weights,
        work_dir=str(settings.work_dir),
        max_trials_global=per_task * len(tasks),
        max_trials_per_task=per_task,
        num_trials_per_iter=per_iter,
        builder=builder,
        runner=runner,
        database=database,
        measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), counter],
    )
    return database, counter


def _seconds(run_secs: Any) -> float:
    return float(statistics.median(float(s) for s in run_secs))


def _default_secs(task_mod: Any, target: Any, builder: Any, runner: Any) -> float:
    """The default rules' schedule of one task, timed like a candidate: what tuning must beat.

    ``DEFAULT_FAILED`` where it does not build or run, so it is not retried on every build."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from targets.tvm_schedules import apply_default_schedules

    # On a copy: the default rules' pass has been seen to schedule the task's own module in place,
    # which the search (and the workload the store keeps) must never see.
    with target:
        scheduled, _ = apply_default_schedules(tvm.ir.load_json(tvm.ir.save_json(task_mod)))
    (built,) = builder.build([ms.builder.BuilderInput(scheduled, target)])
    if built.error_msg:
        return DEFAULT_FAILED
    try:
        args = ms.arg_info.ArgInfo.from_prim_func(scheduled["main"])
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, "cpu", args)])
        result = future.result()
    finally:
        shutil.rmtree(Path(built.artifact_path).parent, ignore_errors=True)
    return DEFAULT_FAILED if result.error_msg else _seconds(result.run_secs)


def _entry_of(task: Any, key: str, database: Any, trials: int, default_secs: float | None) -> Entry | None:
    """The entry of one searched task from its best measured records (seeded ones too); None: none ran."""
    import tvm

    workload = database.commit_workload(task.dispatched[0])
    records = sorted((r for r in database.get_top_k(workload, TOP_K) if r.run_secs), key=lambda r: _seconds(r.run_secs))
    if not records:
        return None
    return Entry(
        key=key,
        workload=workload.as_json(),
        records=tuple(r.as_json() for r in records),
        run_secs=tuple(_seconds(r.run_secs) for r in records),
        default_secs=default_secs,
        key_fields={"target": target_fields(task.target), "tvm": tvm.__version__},
        trials=trials,
    )


def _apply_database(entries: list[Entry]) -> Any:
    from tvm.s_tir import meta_schedule as ms

    database = ms.database.MemoryDatabase()
    for entry in entries:
        workload = database.commit_workload(ms.database.Workload.from_json(entry.workload).mod)
        for record in entry.records:
            database.commit_tuning_record(ms.database.TuningRecord.from_json(record, workload))
    return database


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
        return _default_secs(task.dispatched[0], self.target, *self.builder_runner)


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
        database, counter = _search([t for t, _ in group], seeds, need, deadline, settings, ctx.builder_runner)
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
        ctx = _Measure(target, _builder_runner())
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
    return _apply_database(used), report


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
