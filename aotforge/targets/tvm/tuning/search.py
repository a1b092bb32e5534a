"""Running MetaSchedule on a small host for ``targets.tvm.tuning.tune``: building, timing, searching.

Candidates are built in this process: the stock ``LocalBuilder`` starts a fresh worker for every
batch, and each worker spends tens of seconds importing TVM's tensor intrinsics, which also made its
30 s timeout kill most builds. They still
run in a separate process (``LocalRunner``), so a crashing candidate cannot take the build down.
The cost model is xgboost (``pip install xgboost-cpu``: plain ``xgboost`` pulls ~470 MB of NVIDIA
libraries).
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from aotforge.core.errors import CompileError
from aotforge.targets.tvm.tuning.store import DEFAULT_FAILED, Entry


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


def builder_runner() -> tuple[Any, Any]:
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner

    builder = _in_process_builder()
    runner = LocalRunner(timeout_sec=60, evaluator_config=EvaluatorConfig(number=3, repeat=3, min_repeat_ms=40))
    return builder, runner


def _import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (every TuneContext does) without a minute of ``inspect``.

    Each of their ~500 TVMScript functions calls ``inspect.stack()``, which looks up the module of
    every frame below it. A frame whose file no module has (the frozen importlib frames of the import,
    the parser's expressions compiled as ``<ast>``) makes each lookup scan all of ``sys.modules``: the
    more modules a build or a test run has loaded, the longer. Naming those files in ``inspect``'s own
    cache skips the scans (``<ast>`` to no module: the lookup's answer, None, without the scan). And in
    a thread of its own the import's stack holds only its own frames, not the ~100 of the build (or the
    test runner) that asked: each ``inspect.stack()`` walks a few dozen frames instead.
    """
    import inspect
    import os
    import threading

    for name in ("importlib._bootstrap", "importlib._bootstrap_external"):
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)
    for file in ("<ast>", os.path.normcase(os.path.abspath("<ast>"))):
        inspect.modulesbyfile.setdefault(file, "<ast>")
    failed: list[BaseException] = []

    def load() -> None:
        try:
            import tvm.s_tir.tensor_intrin  # noqa: F401
        except BaseException as e:  # re-raised in the caller's thread
            failed.append(e)

    loader = threading.Thread(target=load, name="tvm-tensor-intrinsics")
    loader.start()
    loader.join()
    if failed:
        raise failed[0]


def search(
    tasks: list[Any],
    seeds: list[Entry | None],
    per_task: int,
    deadline: float | None,
    work_dir: Path,
    seed: int,
    builder_and_runner: tuple[Any, Any],
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
        tasks, work_dir=str(work_dir), strategy=strategy, seed=seed
    )
    database = entries_database([e for e in seeds if e is not None])
    builder, runner = builder_and_runner
    ms.tune.tune_tasks(
        tasks=contexts,
        task_weights=weights,
        work_dir=str(work_dir),
        max_trials_global=per_task * len(tasks),
        max_trials_per_task=per_task,
        num_trials_per_iter=per_iter,
        builder=builder,
        runner=runner,
        database=database,
        measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), counter],
    )
    return database, counter


def seconds(run_secs: Any) -> float:
    return float(statistics.median(float(s) for s in run_secs))


def default_secs(task_mod: Any, target: Any, builder: Any, runner: Any) -> float:
    """The default rules' schedule of one task, timed like a candidate: what tuning must beat.

    ``DEFAULT_FAILED`` where it does not build or run, so it is not retried on every build."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from aotforge.targets.tvm.schedules import apply_default_schedules

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
    return DEFAULT_FAILED if result.error_msg else seconds(result.run_secs)


def entries_database(entries: list[Entry]) -> Any:
    """A MetaSchedule database holding ``entries``' workloads and records."""
    from tvm.s_tir import meta_schedule as ms

    database = ms.database.MemoryDatabase()
    for entry in entries:
        workload = database.commit_workload(ms.database.Workload.from_json(entry.workload).mod)
        for record in entry.records:
            database.commit_tuning_record(ms.database.TuningRecord.from_json(record, workload))
    return database
