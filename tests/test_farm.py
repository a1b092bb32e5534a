"""Build farms: one model for several targets (compiler.farm.multi) and plans of models x targets (matrix)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from aotforge.compiler.api import build_matrix
from aotforge.compiler.farm import report
from aotforge.compiler.farm.plan import load_plan
from aotforge.compiler.farm.prepare import options_per_target
from aotforge.compiler.farm.spec import is_multi, parse_targets
from aotforge.core.errors import EXIT_PARTIAL, OptionsError
from tests.test_errors import invoke_cli
from tests.tiny_models import relu_add


def test_target_lists() -> None:
    assert is_multi("tvm,onnxruntime") and is_multi("all") and is_multi(["tvm"]) and not is_multi("tvm")
    assert parse_targets("tvm, onnxruntime,tvm") == ["tvm", "onnxruntime"]
    assert parse_targets("all") == ["tvm", "onnxruntime", "tensorrt", "neuron"]
    with pytest.raises(OptionsError, match="unknown target.*tvmm"):
        parse_targets("tvmm,onnxruntime")


def test_target_options_split_per_target() -> None:
    per = options_per_target(
        {"tvm.mcpu": "znver4", "onnxruntime": {"optimization_level": "all"}, "x": 1}, ["tvm", "onnxruntime"]
    )
    assert per == {"tvm": {"mcpu": "znver4", "x": 1}, "onnxruntime": {"optimization_level": "all", "x": 1}}


def test_agreement_every_pair_max_rel_l2(tmp_path: Path) -> None:
    a = np.ones((2, 4), np.float32)
    for name, value in (("a", a), ("b", a * 1.01), ("c", a)):
        np.savez(tmp_path / f"{name}.npz", s0_0=value, s1_0=value)
    pairs = report.agreement({t: tmp_path / f"{t}.npz" for t in "abc"})
    assert set(pairs) == {"a~b", "a~c", "b~c"}
    assert pairs["a~c"] == 0.0 and pairs["a~b"] == pytest.approx(0.01 / 1.01, rel=1e-3)
    rows = [{"model": "m", "target": t, "status": "ok"} for t in "abc"]
    report.fill_agreement(rows, pairs)
    assert rows[2]["agreement_rel_l2"] == pairs["b~c"]


def test_plan_is_checked_before_anything_builds(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[build]]\nmodel = "m.onnx"\ntargets = ["tvm"]\npasses = ["O1"]\n'
        "[build.target_options.tvm]\nfast_math = true\n"
    )
    entry = load_plan(plan).entries[0]
    assert entry.model == str(tmp_path / "m.onnx") and entry.targets == ("tvm",)
    assert entry.options["target_options"] == {"tvm": {"fast_math": True}}
    assert entry.resources_for("tensorrt")["GPU"] == 1.0 and entry.resources_for("tvm") == {"CPU": 1.0}
    for text, match in (
        ('[[build]]\nmodel = "m.onnx"\n', "no targets"),
        ('[[build]]\nmodel = "m.onnx"\ntargets = ["tvm"]\ncolour = 1\n', "unknown key.*colour"),
        ('[[build]]\nmodel = "m.onnx"\ntargets = ["tvm"]\n[build.target_options.onnxruntime]\n', "target_options"),
        ('outt = "x"\n', "unknown key.*outt"),
        ('[[build]]\nmodel = "m.onnx"\ntargets = ["tvm"]\n[resources.tvm]\nGPU = "one"\n', "resource = amount"),
    ):
        plan.write_text(text)
        with pytest.raises(OptionsError, match=match):
            load_plan(plan)


def test_two_targets_share_the_frontend_and_are_compared(tmp_path: Path) -> None:
    """tvm and onnxruntime from one frontend run: one IR (same sha256), one version, a comparison beside them."""
    model = relu_add(tmp_path / "m.onnx")
    result = build_matrix(
        model, targets=["tvm", "onnxruntime"], out=tmp_path / "out", bench=False, validation_samples=2
    )
    assert result.ok, result.table()
    assert [r["target"] for r in result.rows] == ["tvm", "onnxruntime"]
    assert len({r["ir_sha256"] for r in result.rows}) == 1
    assert sorted(result.artifacts) == ["m/onnxruntime", "m/tvm"]
    summary = json.loads((tmp_path / "out/m/1/matrix.json").read_text())
    assert summary["agreement"]["m"]["onnxruntime~tvm"] < 1e-6
    assert {p.name for p in result.files.values()} == {"matrix.json", "matrix.md", "matrix.png"}
    assert (tmp_path / "out/m/1/matrix.png").read_bytes()[:4] == b"\x89PNG"
    assert all(r["worker"]["executor"] == "local" for r in result.rows)
    assert not list((tmp_path / "out").glob(".farm-*"))  # the bundles and worker logs are gone


def test_cli_failed_target_fails_its_row_and_the_exit(tmp_path: Path) -> None:
    """tensorrt cannot build here: its row says why (the probe), onnxruntime is still built, the exit is 1."""
    model = relu_add(tmp_path / "m.onnx")
    run = invoke_cli(
        "compile", str(model), "--target", "onnxruntime,tensorrt", "--out", str(tmp_path / "o"), "--no-bench"
    )
    assert run.returncode == EXIT_PARTIAL, run.stderr
    assert run.stdout.strip().splitlines() == [str(tmp_path / "o/m/1/onnxruntime")]
    assert "m / tensorrt: target tensorrt is not available on this host" in run.stderr
    md = (tmp_path / "o/m/1/matrix.md").read_text()
    assert "| m | onnxruntime | ok |" in md and "| m | tensorrt | failed |" in md


def _ours(pid: int) -> bool:
    """Whether ``pid`` descends from this process: a test run beside this one (xdist) has farm workers too."""
    while pid > 1:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if pid == os.getpid():
            return True
    return False


def test_crashed_worker_fails_its_row_only(tmp_path: Path) -> None:
    """A worker killed by a signal (a backend segfault) fails its target; the next target still builds."""
    model = relu_add(tmp_path / "m.onnx")
    killed: list[int] = []

    def kill_first_worker() -> None:
        end = time.monotonic() + 300
        while not killed and time.monotonic() < end:
            for proc in Path("/proc").iterdir():
                try:
                    cmd = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"aotforge.compiler.farm.worker" in cmd and proc.name.isdigit() and _ours(int(proc.name)):
                    os.kill(int(proc.name), signal.SIGSEGV)
                    killed.append(int(proc.name))
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_first_worker)
    killer.start()
    result = build_matrix(model, targets="tvm,onnxruntime", out=tmp_path / "out", bench=False, validation_samples=2)
    killer.join()
    rows = {r["target"]: r for r in result.rows}
    assert killed and rows["tvm"]["status"] == "failed" and rows["onnxruntime"]["status"] == "ok"
    assert "crashed with SIGSEGV" in rows["tvm"]["error"] and "nothing was stored" in rows["tvm"]["error"]
    assert not (tmp_path / "out/m/1/tvm").exists()
    assert not [p for p in (tmp_path / "out").rglob(".staging-*")]


def test_matrix_plan_local_is_cache_aware_and_keeps_going(tmp_path: Path) -> None:
    relu_add(tmp_path / "a.onnx")
    relu_add(tmp_path / "b.onnx", shape=(2, 4))
    (tmp_path / "plan.toml").write_text(
        'out = "farm"\n'
        '[[build]]\nmodel = "a.onnx"\ntargets = ["onnxruntime"]\nbench = false\nvalidation_samples = 2\n'
        '[[build]]\nmodel = "missing.onnx"\ntargets = ["onnxruntime"]\n'
        '[[build]]\nmodel = "b.onnx"\ntargets = ["onnxruntime"]\nbench = false\nvalidation_samples = 2\n'
    )

    def run() -> subprocess.CompletedProcess[str]:
        return invoke_cli("matrix", str(tmp_path / "plan.toml"), "--jobs", "2")

    first = run()
    assert first.returncode == EXIT_PARTIAL, first.stderr
    summary = json.loads((tmp_path / "farm/matrix.json").read_text())
    status = [(r["model"], r["status"]) for r in summary["rows"]]
    assert status == [("a", "ok"), ("missing", "failed"), ("b", "ok")], first.stderr
    assert "missing.onnx" in summary["rows"][1]["error"]
    second = run()
    again = json.loads((tmp_path / "farm/matrix.json").read_text())
    assert [r["status"] for r in again["rows"]] == ["cached", "failed", "cached"], second.stderr
    assert "0 model(s) to prepare" not in second.stderr  # the missing model is tried again, the rest is not
    assert [r["path"] for r in again["rows"] if r["status"] == "cached"] == [
        r["path"] for r in summary["rows"] if r["status"] == "ok"
    ]


def test_target_all_is_what_probes_here() -> None:
    from aotforge.compiler.farm.multi import resolve_targets
    from aotforge.targets import get_target

    wanted, skipped = resolve_targets("all")
    assert set(wanted) | set(skipped) == {"tvm", "onnxruntime", "tensorrt", "neuron"}
    for name, why in skipped.items():
        assert why == get_target(name).probe().reason
    assert all(get_target(t).probe().compiles for t in wanted)
