"""MetaSchedule tuning for the tvm target: store keys, re-use, corrupt entries, and a real tuned build."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tvm

from aotforge.artifacts.manifest import MANIFEST
from aotforge.core.errors import OptionsError
from aotforge.core.options import options_from_dict
from aotforge.targets.tvm.host import host_cpu
from aotforge.targets.tvm.options import TUNING_DIR, TvmOptions
from aotforge.targets.tvm.target import TvmTarget
from aotforge.targets.tvm.tuning.store import DEFAULT_FAILED, Entry, TuningStore, digest, workload_key
from aotforge.targets.tvm.tuning.tune import tunable_tasks
from tests.conftest import quick_build

TARGET = {"kind": "llvm", "mcpu": "znver4", "mtriple": "x86_64-pc-linux-gnu", "num-cores": 2}


class _Two(torch.nn.Module):
    """A shared 64->48 layer, then a head that differs between the two models."""

    def __init__(self, head: int) -> None:
        super().__init__()
        self.shared = torch.nn.Linear(64, 48)
        self.head = torch.nn.Linear(48, head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.shared(x)))


def _legalized(model: torch.nn.Module, target: Any) -> Any:
    from tvm.relax.backend.cpu_generic import pipeline as cpu
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(torch.export.export(model.eval(), (torch.randn(4, 64),)), keep_params_as_input=False)
    with target:
        return tvm.transform.Sequential(cpu.library_dispatch_passes(target) + cpu.legalize_passes(target))(mod)


def _entry(key: str, secs: list[float], default: float | None = 1.0) -> Entry:
    return Entry(
        key=key,
        workload=["hash", "mod-b64"],
        records=tuple([[f"trace-{s}"], [s]] for s in secs),
        run_secs=tuple(secs),
        default_secs=default,
        key_fields={"target": TARGET},
    )


def test_key_changes_with_mcpu_cores_and_tvm_version() -> None:
    base = workload_key(123, TARGET, "0.27.0")
    assert workload_key(123, dict(TARGET), "0.27.0") == base
    assert workload_key(124, TARGET, "0.27.0") != base
    assert workload_key(123, {**TARGET, "mcpu": "skylake-avx512"}, "0.27.0") != base
    assert workload_key(123, {**TARGET, "num-cores": 4}, "0.27.0") != base
    assert workload_key(123, {**TARGET, "mtriple": "aarch64-linux-gnu"}, "0.27.0") != base
    assert workload_key(123, TARGET, "0.28.0") != base


def test_two_models_share_the_common_workload_key() -> None:
    target = tvm.target.Target(TARGET)
    torch.manual_seed(0)
    _, keys_a = tunable_tasks(_legalized(_Two(16), target), target)
    _, keys_b = tunable_tasks(_legalized(_Two(24), target), target)
    # Weights are bound as constants into Relax, not into the PrimFuncs: the 64->48 layer is one workload.
    assert len(keys_a) == len(keys_b) == 2
    assert len(set(keys_a) & set(keys_b)) == 1
    other_cores = tvm.target.Target({**TARGET, "num-cores": 4})
    _, keys_c = tunable_tasks(_legalized(_Two(16), other_cores), other_cores)
    assert not set(keys_c) & set(keys_a)


def test_merge_keeps_the_best_records_and_lands_whole(tmp_path: Path) -> None:
    store = TuningStore(tmp_path)
    store.merge(_entry("ab" * 32, [3e-6, 5e-6]))
    merged = store.merge(_entry("ab" * 32, [1e-6, 5e-6, 9e-6]))
    assert merged.run_secs == (1e-6, 3e-6, 5e-6)
    assert store.read("ab" * 32) == merged
    assert not list(tmp_path.rglob(".tmp-*"))
    assert merged.beats_default and not _entry("cd" * 32, [2.0]).beats_default
    # A default never timed, or one that could not run, leaves the tuned record in use.
    assert _entry("cd" * 32, [2.0], default=None).beats_default
    assert _entry("cd" * 32, [2.0], default=DEFAULT_FAILED).beats_default
    assert digest([merged]) != digest([_entry("ab" * 32, [3e-6])])


def test_corrupt_entry_is_reported_removed_and_not_served(tmp_path: Path) -> None:
    store = TuningStore(tmp_path)
    key = "ef" * 32
    store.merge(_entry(key, [2e-6]))
    path = store.path(key)
    data = json.loads(path.read_text())
    data["run_secs"] = [1e-9]  # an edit that skips the checksum
    path.write_text(json.dumps(data))
    assert store.read(key) is None
    assert store.corrupt == [key] and not path.exists()
    store.merge(_entry(key, [2e-6]))
    path.write_text(path.read_text()[:40])  # a torn write
    assert store.read(key) is None and store.corrupt == [key, key]


def test_options_validate_and_parse_from_the_cli_form(tmp_path: Path) -> None:
    opts = options_from_dict(TvmOptions, {"tune_trials": "64", "tune_minutes": "2.5"}, what="tvm")
    assert (opts.tune_trials, opts.tune_minutes, opts.tuning) == (64, 2.5, True)
    assert not TvmOptions().tuning
    with pytest.raises(OptionsError, match="tune_trials"):
        TvmOptions(tune_trials=-1)
    assert TvmTarget().with_cache_dir(opts, tmp_path).tuning_db == str(tmp_path / TUNING_DIR)
    assert TvmTarget().with_cache_dir(TvmOptions(), tmp_path).tuning_db == ""
    from aotforge.targets.tvm.options import check_tunable

    with pytest.raises(OptionsError, match="static shapes"):
        check_tunable(TvmOptions(tune_trials=8, dynamic=True))
    other = "skylake-avx512" if host_cpu() != "skylake-avx512" else "znver4"
    with pytest.raises(OptionsError, match="measures candidates on this host"):
        check_tunable(TvmOptions(tune_trials=8, mcpu=other))


def _tvm_build(out: Path, **target_options: Any) -> tuple[dict[str, Any], np.ndarray, float]:
    torch.manual_seed(0)
    model, x = _Two(16).eval(), torch.randn(4, 64)
    started = time.perf_counter()
    result = quick_build(model, out, example_inputs={"x": x}, target="tvm", target_options=target_options)
    seconds = time.perf_counter() - started
    manifest: dict[str, Any] = json.loads((result.path / MANIFEST).read_text())
    from aotforge.artifacts.loader import load

    (y,) = load(result.path).run({manifest["io"]["inputs"][0]["name"]: x.numpy()}).values()
    return manifest, y, seconds


@pytest.mark.slow
def test_tuned_build_matches_untuned_and_rebuilds_from_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _, untuned, plain_seconds = _tvm_build(tmp_path / "plain")
    first, tuned, tuning_seconds = _tvm_build(tmp_path / "a", tune_trials=8, tuning_db=str(store))
    report = first["target"]["info"]["pipeline"]["schedules"]["tuning"]
    assert report["tasks"] == 2 and report["tuned"] + report["untuned"] == 2
    assert (report["reused"], report["retuned"]) == (0, 0)
    assert report["trials"] > 0 and report["tuning_seconds"] > 0
    assert report["from_database"] == report["tuned"] - report["default_faster"]
    np.testing.assert_allclose(tuned, untuned, rtol=1e-4, atol=1e-5)
    again, rebuilt, seconds = _tvm_build(tmp_path / "b", tune_trials=8, tuning_db=str(store))
    second = again["target"]["info"]["pipeline"]["schedules"]["tuning"]
    assert second["reused"] == report["tuned"] and (second["retuned"], second["trials"]) == (0, 0)
    assert second["database_digest"] == report["database_digest"]
    np.testing.assert_array_equal(rebuilt, tuned)
    # Side by side, in this process: applying the stored records costs less than half of what the search added.
    assert seconds - plain_seconds < (tuning_seconds - plain_seconds) / 2


# Re-tuning with a bigger budget: real MetaSchedule on one 64->48 Linear (one task), a few trials.
# One store is tuned once per module (2 trials); each test works on its own copy of it.


def _linear_case() -> tuple[Any, Any, np.ndarray, np.ndarray]:
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    model, x = torch.nn.Linear(64, 48).eval(), torch.randn(4, 64)
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=False)
    target = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    with torch.no_grad():
        return mod, target, x.numpy(), model(x).numpy()


_CASE: dict[str, Any] = {}


def _tuned_build(store: Path, trials: int, work: Path) -> dict[str, Any]:
    """A real compile of the Linear with tuning against ``store``; its output checked against torch."""
    from tvm import relax

    from aotforge.targets.tvm.pipeline import compile_relax
    from aotforge.targets.tvm.tuning.tune import TuneSettings

    if not _CASE:
        _CASE["mod"], _CASE["target"], _CASE["x"], _CASE["y"] = _linear_case()
    # pytest's log capture leaves unnamed handlers on MetaSchedule's logger, and TVM's logger set-up
    # lists that logger's handlers by name: a second search in one process would fail on None.
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
    work.mkdir(parents=True, exist_ok=True)
    settings = TuneSettings(trials=trials, work_dir=work, store_dir=store)
    executable, info = compile_relax(_CASE["mod"], _CASE["target"], fast_math=False, tuning=settings)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(_CASE["x"]))
    y = (out[0] if isinstance(out, tvm.ir.Array | list | tuple) else out).numpy()
    np.testing.assert_allclose(y, _CASE["y"], rtol=1e-4, atol=1e-5)
    report: dict[str, Any] = info["schedules"]["tuning"]
    return report


def _only_entry(store: Path) -> Entry:
    (path,) = store.rglob("*.json")
    return Entry.from_json(json.loads(path.read_text()))


@pytest.fixture(scope="module")
def tuned_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("tuned") / "store"
    report = _tuned_build(store, 2, store.parent / "work")
    assert (report["tasks"], report["tuned"], report["retuned"], report["reused"]) == (1, 1, 0, 0)
    assert _only_entry(store).trials == 2
    return store


def _copy(store: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(store, tmp_path / "store"))


def test_same_or_smaller_budget_reuses(tuned_store: Path, tmp_path: Path) -> None:
    store = _copy(tuned_store, tmp_path)
    before = _only_entry(store)
    for trials in (2, 1):
        report = _tuned_build(store, trials, tmp_path / f"w{trials}")
        assert (report["reused"], report["retuned"], report["tuned"], report["trials"]) == (1, 0, 0, 0)
    assert _only_entry(store) == before


def test_bigger_budget_retunes_from_the_records_and_records_the_trials(tuned_store: Path, tmp_path: Path) -> None:
    store = _copy(tuned_store, tmp_path)
    before = _only_entry(store)
    report = _tuned_build(store, 4, tmp_path / "w")
    assert (report["retuned"], report["reused"], report["tuned"], report["trials_per_task"]) == (1, 0, 0, 4)
    assert report["trials"] == 2  # continued: the 2 trials the entry lacked, not 4 afresh
    after = _only_entry(store)
    assert after.trials == 4 and after.run_secs[0] <= before.run_secs[0]
    again = _tuned_build(store, 4, tmp_path / "w2")
    assert (again["reused"], again["retuned"], again["trials"]) == (1, 0, 0)


def test_retune_that_finds_nothing_better_keeps_the_old_record(tuned_store: Path, tmp_path: Path) -> None:
    store = _copy(tuned_store, tmp_path)
    old = _only_entry(store)
    # The stored best made unbeatable (1 ps), checksum and all: no new candidate can replace it.
    best = dataclasses.replace(old, run_secs=(1e-12, *old.run_secs[1:]))
    store_obj = TuningStore(store)
    store_obj.path(old.key).write_text(json.dumps(best.to_json()))
    report = _tuned_build(store, 4, tmp_path / "w")
    assert report["retuned"] == 1 and report["retuned_faster"] == 0 and report["trials"] > 0
    after = _only_entry(store)
    assert after.trials == 4
    assert (after.run_secs[0], after.records[0]) == (1e-12, old.records[0])


def test_old_format_entry_counts_as_legacy_trials(tuned_store: Path, tmp_path: Path) -> None:
    from aotforge.targets.tvm.tuning.store import LEGACY_TRIALS
    from aotforge.targets.tvm.tuning.tune import TuneSettings, _still_needed

    store = _copy(tuned_store, tmp_path)
    legacy = dataclasses.replace(_only_entry(store), trials=None)
    data = legacy.to_json()
    assert "trials" not in data  # what the previous version wrote, checksum included
    TuningStore(store).path(legacy.key).write_text(json.dumps(data))
    assert _only_entry(store).trials is None
    # Unknown, not 0: a small request (here 4 trials for the one task) re-uses it as it is.
    report = _tuned_build(store, 4, tmp_path / "w")
    assert (report["reused"], report["retuned"], report["trials"]) == (1, 0, 0)
    assert _only_entry(store) == legacy
    # Above LEGACY_TRIALS it is searched again, for the whole budget: its count is not known.
    found, work = {legacy.key: legacy}, tmp_path / "w"
    assert _still_needed([legacy.key], found, TuneSettings(trials=LEGACY_TRIALS, work_dir=work)) == {}
    more = TuneSettings(trials=LEGACY_TRIALS + 1, work_dir=work)
    assert _still_needed([legacy.key], found, more) == {legacy.key: LEGACY_TRIALS + 1}
    # Merging a re-tune into it records the known count.
    merged = TuningStore(store).merge(dataclasses.replace(legacy, trials=LEGACY_TRIALS + 1))
    assert merged.trials == LEGACY_TRIALS + 1 and merged.run_secs == legacy.run_secs


def test_per_task_budget_and_minutes_only_reuse(tmp_path: Path) -> None:
    from aotforge.targets.tvm.tuning.tune import MINUTES_ONLY_TRIALS, TuneSettings, _still_needed

    searched, fresh = dataclasses.replace(_entry("aa" * 32, [1e-6]), trials=4), "bb" * 32
    keys, found = [searched.key, fresh], {searched.key: searched}
    # 10 trials over 2 tasks: 5 each, counted over both though one is stored; 1 more for the stored one.
    assert _still_needed(keys, found, TuneSettings(trials=10, work_dir=tmp_path)) == {searched.key: 1, fresh: 5}
    assert _still_needed(keys, found, TuneSettings(trials=8, work_dir=tmp_path)) == {fresh: 4}
    # Minutes alone: no trial budget to compare, so the stored entry is re-used; the new one runs on the clock.
    clock = TuneSettings(trials=0, minutes=1.0, work_dir=tmp_path)
    assert _still_needed(keys, found, clock) == {fresh: MINUTES_ONLY_TRIALS}
