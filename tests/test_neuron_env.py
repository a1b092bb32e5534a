"""The Neuron worker protocol and environment discovery, run for real in separate interpreters.

Nothing here is Neuron: no environment on this host has torch-neuronx. What is proven is that
the target finds an environment, runs the worker under that environment's own interpreter with
``-I`` (aotforge's PYTHONPATH does not leak in), reads what it holds, names what it lacks, and
turns every failure mode of the subprocess into one CompileError. The compile itself is the
``neuron``-marked end-to-end test in tests/test_neuron_target.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aotforge.core.errors import CompileError, OptionsError, TargetUnavailableError
from aotforge.targets.neuron import env, worker


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, empty virtual environment: its own interpreter, no torch, no Neuron packages."""
    root = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    return root / "bin" / "python"


def test_an_empty_environment_reports_what_it_lacks(bare_venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Our own site-packages (with torch) on PYTHONPATH: -I must keep it out of the worker.
    site = next(p for p in sys.path if p.endswith("site-packages"))
    monkeypatch.setenv("PYTHONPATH", site)
    found = env.inspect(bare_venv)
    assert found.packages == {"torch": None, "torch-neuronx": None, "neuronx-cc": None, "libneuronxla": None}
    assert found.api == "" and "ModuleNotFoundError" in found.import_error
    assert found.missing() == [
        "python package 'torch'",
        "python package 'torch-neuronx'",
        "python package 'neuronx-cc'",
    ]


def test_our_own_environment_is_named_torchneuron_era_and_lacking_trace() -> None:
    # aotforge's environment, torch 2.13: past the last torch_neuronx.trace release (2.9).
    found = env.inspect(Path(sys.executable))
    import torch

    assert found.packages["torch"] == torch.__version__ and found.api == "torchneuron"
    gaps = found.missing()
    assert "python package 'torch-neuronx'" in gaps and any("torch <= 2.9" in g for g in gaps)


@pytest.mark.parametrize(("torch", "api"), [("2.9.0", "trace"), ("2.8.1+cpu", "trace"), ("2.10.0", "torchneuron")])
def test_api_follows_the_torch_release(torch: str, api: str) -> None:
    assert env.NeuronEnv(Path("p"), {"torch": torch}, "").api == api


def test_a_complete_trace_era_environment_lacks_nothing() -> None:
    packages: dict[str, str | None] = {"torch": "2.9.0", "torch-neuronx": "2.9.0.2.11", "neuronx-cc": "2.21.0"}
    assert env.NeuronEnv(Path("p"), packages, "").missing() == []


def test_discovery_takes_the_option_then_the_dlami_venvs(bare_venv: Path, tmp_path: Path) -> None:
    assert env.find_python(str(bare_venv)) == bare_venv
    with pytest.raises(OptionsError, match="does not exist"):
        env.find_python(str(tmp_path / "nope" / "python"))
    assert env.find_python("", (tmp_path / "missing", bare_venv)) == bare_venv
    with pytest.raises(TargetUnavailableError, match="tried .*aws_neuronx_venv_pytorch_2_9.*--target-opt python="):
        env.find_python("")  # no DLAMI venv on this host


def test_a_failing_op_comes_back_as_one_compile_error(bare_venv: Path, tmp_path: Path) -> None:
    # The worker runs, the op fails (no numpy / torch there): an answer, not a crash.
    request = {"op": "trace", "program": "p.pt2", "examples": "e.npz", "compiler_args": [], "workdir": "w"}
    with pytest.raises(CompileError, match="op 'trace' failed under .*ModuleNotFoundError"):
        env.call(bare_venv, {**request, "out": str(tmp_path / "o.pt"), "cpu_backend": True}, timeout=60)


def test_a_worker_that_dies_without_an_answer_is_named(tmp_path: Path) -> None:
    with pytest.raises(CompileError, match="exited 1 without an answer"):
        env.call(Path("/bin/false"), {"op": "probe"}, timeout=30)
    with pytest.raises(CompileError, match="did not finish"):
        env.call(tmp_path / "no-such-python", {"op": "probe"}, timeout=30)


@pytest.mark.parametrize(
    ("request_", "error"),
    [({"protocol": 0, "op": "probe"}, "protocol 0, worker 1"), ({"protocol": 1, "op": "nope"}, "unknown op 'nope'")],
)
def test_the_worker_refuses_other_protocols_and_ops(request_: dict[str, object], error: str) -> None:
    response = worker.handle(request_)
    assert response["ok"] is False and error in str(response["error"])


def test_probe_names_the_environment_and_why_it_cannot_compile() -> None:
    from aotforge.targets.neuron import sdk

    probe = sdk.probe(sys.executable)  # an existing environment, but torch 2.13 and no torch-neuronx
    assert not probe.compiles
    assert f"the Neuron environment at {sys.executable} lacks" in probe.reason and "torch <= 2.9" in probe.reason


def test_the_hand_off_reaches_the_worker_intact_up_to_torch_neuronx(tmp_path: Path) -> None:
    """The masked module as a torch.export file and the examples as an npz, loaded and run by the
    worker in another process; it then stops at ``import torch_neuronx``. Proves the hand-off, NOT Neuron."""
    import numpy as np
    import torch

    from aotforge.targets.neuron import sdk

    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    examples = [np.ones((2, 8), np.float32)]
    with pytest.raises(CompileError, match="op 'trace' failed .*No module named 'torch_neuronx'"):
        sdk.trace_in_worker(Path(sys.executable), module, examples, ["--target", "inf2"], tmp_path, tmp_path / "m.pt")
    assert (tmp_path / "program.pt2").is_file() and not (tmp_path / "m.pt").exists()
    with np.load(tmp_path / "examples.npz") as npz:
        assert npz.files == ["arr_0"] and npz["arr_0"].shape == (2, 8)
