"""Shared fixtures: the targets this host can run, and a quiet, fast build helper."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import statistics
import warnings
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import onnx
import pytest

# One thread a runtime in the test processes and in every process they start (tvm's pool, torch and aotforge's ONNX
# Runtime sessions read OMP_NUM_THREADS, set here before any is imported): the default run's two workers share two
# cores, where a runtime's second thread spin-waits against the other worker. A test that asks for a thread count
# sets it itself (``bench --threads``). A count set in the environment is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.api import BuildResult, build
from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.isolation import keep_spare_workers
from aotforge.targets import get_target
from tests.in_process import ISOLATE_BACKEND
from tests.llm_models import (
    EXPORT_CACHE,
    SPECULATIVE_K,
    TVM_BUCKETS,
    build_text_generation,
    save_tiny_causal_lm,
    tiny_llama,
)
from tests.lm_pair import LmPair, trained_pair
from tests.serving import API_KEY, MAX_BATCH, Served, build_chat_llama, serving

warnings.filterwarnings("ignore")
# No spare isolated worker started ahead: the helpers' builds run in the test's process (tests/in_process.py), so a
# spare started after a CLI build mostly waits for a build that never comes, and its start (an interpreter and the
# backend's imports) is the default run's time on 2 cores. AOTFORGE_SPARE_WORKERS=1 keeps one (compiler/isolation.py).
keep_spare_workers(os.environ.get("AOTFORGE_SPARE_WORKERS", "0") == "1")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ONNX_LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
#: The targets the README's install gives every host: their tests never skip (``_require_cpu_targets``).
CPU_TARGETS = ("tvm", "onnxruntime")
FAST_BENCH = BenchOptions(warmup=1, min_runs=3, max_runs=5, max_seconds=0.5)
#: Each test file's seconds in a measured default run (``make test-durations`` rewrites it): the order files go to
#: the workers in. A stale or missing entry only changes the order.
FILE_SECONDS: dict[str, float] = json.loads((Path(__file__).with_name("file_durations.json")).read_text())


def quick_build(model: Any, out: Path, **overrides: Any) -> BuildResult:
    """A build with few validation samples and no benchmark unless asked, for test speed."""
    overrides.setdefault("bench", False)
    overrides.setdefault("validation_samples", 2)
    overrides.setdefault("bench_options", FAST_BENCH)
    overrides.setdefault("plots", False)  # matplotlib costs ~1 s a build; tests/test_model_card.py draws them
    overrides.setdefault("isolate_backend", ISOLATE_BACKEND)
    return build(model, out=out, **overrides)


def tree_state(path: Path) -> dict[str, str] | None:
    """Every file (its sha256) and directory ("dir") under ``path``; None where ``path`` does not exist. Equal
    before and after a failed command: it left nothing behind, half-written or whole, and changed nothing."""
    if not path.exists():
        return None
    return {
        p.relative_to(path).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
    }


def assert_refused(result: Any, exit_code: int, match: str) -> None:
    """A CLI result that failed as a user sees it should: this exit status, one error line saying ``match``, no
    traceback and no ``internal error``."""
    assert result.exit_code == exit_code, result.output
    errors = [line for line in result.output.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1 and re.search(match, errors[0]), result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output


def built_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """``make(dir)``'s artifact, built once per run: under pytest-xdist every worker runs the session fixtures
    of its own files, so the workers of one run share a directory (their basetemp's parent, this run's alone)
    where the first to ask builds and the others wait on a lock and read what it built."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return make(factory.mktemp(name))
    shared = factory.getbasetemp().parent / f"shared-{name}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "artifact-path"
        if not done.is_file():
            shared.mkdir(exist_ok=True)
            done.write_text(str(make(shared / "out")))
        return Path(done.read_text())


def built_result(path: Path) -> BuildResult:
    """The :class:`BuildResult` of an artifact on disk (what a worker that did not build it gets)."""
    return BuildResult(path, read_manifest(path))


@pytest.fixture(scope="session", autouse=True)
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Generator[Path]:
    """The run's export cache for ``build_text_generation`` (``tests/llm_models.py``): the xdist workers of one run
    share it (their basetemp's parent, as ``built_once``), so each tiny model and attention is exported once a run.
    Tests of the export cache itself give their builds a directory of their own."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "export-cache"
    EXPORT_CACHE[:] = [path]
    yield path
    EXPORT_CACHE.clear()


@pytest.fixture(scope="session")
def lm_pair() -> LmPair:
    """The trained target + draft Llama pair (``tests/lm_pair.py``): trained once, then loaded from its cache."""

    return trained_pair()


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama of ``tests/llm_models.py`` as a transformers directory."""
    return save_tiny_causal_lm("llama", tmp_path_factory.mktemp("llama") / "llama-tiny")


@pytest.fixture(scope="session")
def llama_ort(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The tiny Llama for onnxruntime with a verify graph (``--speculative-k 4``) and the benchmark: built once,
    shared by the text-generation, speculative-decoding and failure-path tests (tests must not change it)."""

    def make(out: Path) -> Path:
        return Path(build_text_generation(llama_dir, out, bench=True, speculative_k=SPECULATIVE_K).path)

    return built_result(built_once(tmp_path_factory, "llama-ort", make))


@pytest.fixture(scope="session")
def llama_tp(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The tiny Llama at ``--tensor-parallel 2`` with a verify graph, built once: shared by the tensor-parallel
    tests of its ranks as processes and as Ray actors (tests must not change it)."""

    def make(out: Path) -> Path:
        return Path(build_text_generation(llama_dir, out, tensor_parallel=2, speculative_k=SPECULATIVE_K).path)

    return built_result(built_once(tmp_path_factory, "llama-tp", make))


@pytest.fixture(scope="session")
def llama_pp(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The tiny Llama at ``--pipeline-parallel 2`` with a verify graph, built once: shared by the pipeline-parallel
    tests, and its stage graphs, read back from the export cache, by the int4 stage builds (tests must not change
    it)."""

    def make(out: Path) -> Path:
        return Path(build_text_generation(llama_dir, out, pipeline_parallel=2, speculative_k=SPECULATIVE_K).path)

    return built_result(built_once(tmp_path_factory, "llama-pp", make))


@pytest.fixture(scope="session")
def llama_tvm(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The same for tvm (two prefill buckets); shared like ``llama_ort``."""
    kw = {"target_options": TVM_BUCKETS, "bench": True, "speculative_k": SPECULATIVE_K}

    def make(out: Path) -> Path:
        return Path(build_text_generation(llama_dir, out, target="tvm", **kw).path)

    return built_result(built_once(tmp_path_factory, "llama-tvm", make))


@pytest.fixture(scope="session")
def llama_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unrelated random Llama over the same vocabulary (other seed, 1 layer, narrower; onnxruntime, no verify
    graph): a bad draft for ``llama_ort`` / ``llama_tvm``, and an artifact that cannot verify a draft itself."""
    config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}

    def make(out: Path) -> Path:
        model = tiny_llama(123, **config, num_key_value_heads=1)
        return Path(build_text_generation(model, out, name="bad").path)

    return built_once(tmp_path_factory, "llama-draft", make)


@pytest.fixture(scope="session")
def chat_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with the byte tokenizer and a chat template, for onnxruntime (``tests/serving.py``)."""
    return built_once(tmp_path_factory, "chat-llama", build_chat_llama)


@pytest.fixture(scope="session")
def chat_server(chat_artifact: Path) -> Generator[Served]:
    """``aotforge serve``'s app over ``chat_artifact`` on a free port, asking for ``API_KEY``; shared by the server
    and ``bench serve`` tests (a test that changes the engine's state waits until it is idle again)."""
    from aotforge.runtime.params import EngineConfig

    with serving(chat_artifact, EngineConfig(max_num_seqs=MAX_BATCH), api_key=API_KEY) as served:
        yield served


@pytest.fixture(params=CPU_TARGETS)
def cpu_target(request: pytest.FixtureRequest) -> str:
    return str(request.param)


#: ``AOTFORGE_REQUIRE`` value -> the marker of the tests that must not skip for it. Read here, in the
#: tests, never in library code: ``make device-check`` sets it so a host missing the SDK, the device or
#: a CUDA torch fails loudly instead of exiting 0 with every device test skipped.
REQUIRE_MARKERS = {"tensorrt": "gpu", "neuron": "neuron"}


def _required_markers() -> set[str]:
    wanted = [w.strip() for w in os.environ.get("AOTFORGE_REQUIRE", "").split(",") if w.strip()]
    unknown = [w for w in wanted if w not in REQUIRE_MARKERS]
    if unknown:
        raise pytest.UsageError(
            f"AOTFORGE_REQUIRE={','.join(unknown)} is unknown; use {' or '.join(REQUIRE_MARKERS)} (comma-separated)"
        )
    return {REQUIRE_MARKERS[w] for w in wanted}


def _require_cpu_targets() -> None:
    """TVM and ONNX Runtime are base dependencies: one that cannot be imported or probed here fails the run
    before anything is collected, rather than turning its tests into skips or dropping its parameter."""
    broken = {t: get_target(t).probe() for t in CPU_TARGETS}
    broken = {t: p for t, p in broken.items() if not p.available}
    if broken:
        lines = "; ".join(f"{t}: {p.reason}" for t, p in broken.items())
        raise pytest.UsageError(f"base target(s) unusable on this host, so the suite cannot run: {lines}")


def pytest_configure(config: pytest.Config) -> None:
    _required_markers()  # an unknown value is a usage error before anything runs
    _require_cpu_targets()
    # pytest-xdist would hand out the files with the most tests first; ours go heaviest first (below).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heaviest files first, each file's tests in their own order: under ``--dist loadfile`` a worker takes a
    file at a time, and a long file handed out last (one Ray cluster test is a minute) leaves the other worker idle
    while it runs. A file not measured yet counts as a typical one."""
    typical = statistics.median(FILE_SECONDS.values())
    items.sort(key=lambda item: (-FILE_SECONDS.get(item.path.name, typical), str(item.path)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Under ``AOTFORGE_REQUIRE``, a skip in a test carrying the required marker is a failure."""
    report = yield
    required = _required_markers() & {m.name for m in item.iter_markers()}
    if report.skipped and required and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"AOTFORGE_REQUIRE asks for the {'/'.join(sorted(required))} tests to run, but: {reason}"
    return report
