"""What the README and the docs it links promise, each checked by doing it: ``--dump-ir`` writes the graph after
every pass, the build's progress summary with the libraries quiet, ``bench --max-runs`` caps the runs,
``--target all`` builds every target this host can use, ONNX sources with external data load, the
``examples/minilm_int8.toml`` recipe keeps its quality, and tvm's weight-only takes nothing on a CPU without VNNI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from aotforge.artifacts import load
from aotforge.artifacts.manifest import read_manifest
from aotforge.targets import get_target
from tests.conftest import EXAMPLES, ROOT, quick_build
from tests.test_errors import invoke_cli, run_cli


def _compile(*args: str) -> tuple[Path, str]:
    """In a real process: what its terminal shows, the libraries' C++ logging included, is what is checked."""
    proc = run_cli("compile", *args)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """One ``aotforge compile`` of the README's example with passes and ``--dump-ir``, without ``--verbose``: the
    artifact, the terminal's output and the dump directory, read by the tests below (none changes them)."""
    root = tmp_path_factory.mktemp("compiled")
    dump = root / "ir"
    path, output = _compile(
        str(EXAMPLES / "mini_resnet.py"),
        "--target",
        "onnxruntime",
        "--passes",
        "O1",
        "--out",
        str(root / "out"),
        "--no-bench",
        "--dump-ir",
        str(dump),
    )
    return path, output, dump


def test_dump_ir_writes_the_graph_after_each_pass_and_the_last_is_the_artifacts(
    compiled: tuple[Path, str, Path],
) -> None:
    """One loadable ONNX file per pass the manifest records, numbered in order; the last computes what the
    artifact computes."""
    path, _, dump = compiled
    manifest = read_manifest(path)
    names = [p["name"] for p in manifest.passes]
    files = sorted(dump.glob("*.onnx"))
    assert [f.name for f in files] == [f"{i + 1:02d}_{name}.onnx" for i, name in enumerate(names)]
    for file in files:
        onnx.checker.check_model(str(file))
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    session = ort.InferenceSession(str(files[-1]), providers=["CPUExecutionProvider"])
    (dumped,) = session.run(None, {"image": x})
    np.testing.assert_allclose(load(path).run({"image": x})["logits"], dumped, rtol=1e-5, atol=1e-5)


def test_a_build_prints_its_stage_summary_and_keeps_the_libraries_quiet(compiled: tuple[Path, str, Path]) -> None:
    """The terminal of a build without ``--verbose``: the per-stage summary, the artifact's path last, and no
    warning or logging line from torch's exporter, onnxscript (the O1 passes) or the runtimes (``--verbose`` is
    how to see them)."""
    path, output, _ = compiled
    assert "build stages" in output
    for stage in ("loading model", "running passes", "compiling for onnxruntime", "validating", "writing the artifact"):
        assert stage in output, (stage, output)
    noisy = [ln for ln in output.splitlines() if "warn" in ln.lower() or ln.startswith(("W1", "I1", "[W", "[I"))]
    assert noisy == [], noisy
    assert (path / "manifest.json").is_file()  # stdout's last line (what scripts read) is the artifact


@pytest.fixture(scope="module")
def ort_artifact(compiled: tuple[Path, str, Path]) -> Path:
    return compiled[0]


@pytest.mark.parametrize("max_runs", [3, 7])
def test_bench_max_runs_caps_the_timed_calls(ort_artifact: Path, max_runs: int) -> None:
    """A bench given far more seconds than the runs need stops at ``--max-runs`` timed calls."""
    proc = invoke_cli(
        "bench", str(ort_artifact), "--seconds", "60", "--warmup", "1", "--max-runs", str(max_runs), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(proc.stdout)["results"]
    assert result["runs"] == max_runs


def test_target_all_builds_every_target_this_host_compiles_for(tmp_path: Path) -> None:
    """``--target all``: an artifact per target whose probe compiles here, each validated against the model; the
    others named with their probe's reason, and the build still succeeds."""
    proc = invoke_cli(
        "compile", str(EXAMPLES / "mini_resnet.py"), "--target", "all", "--out", str(tmp_path), "--no-bench"
    )
    assert proc.returncode == 0, proc.stderr
    usable = {name for name in ("tvm", "onnxruntime", "tensorrt", "neuron") if get_target(name).probe().compiles}
    assert {"tvm", "onnxruntime"} <= usable  # base dependencies: never skipped
    built = {p.name for p in (tmp_path / "mini_resnet" / "1").iterdir() if (p / "manifest.json").is_file()}
    assert built == usable
    x = np.random.default_rng(1).random((1, 3, 32, 32), dtype=np.float32)
    outputs = {name: load(tmp_path / "mini_resnet" / "1" / name).run({"image": x})["logits"] for name in built}
    np.testing.assert_allclose(outputs["tvm"], outputs["onnxruntime"], rtol=1e-4, atol=1e-4)
    for name in {"tvm", "onnxruntime", "tensorrt", "neuron"} - usable:
        assert name in proc.stdout + proc.stderr, f"--target all does not say why {name} was left out"


def _external_data_model(path: Path) -> Path:
    """A two-layer MLP whose weights live in a file beside the graph (ONNX external data), as exports of
    models past protobuf's 2 GB limit are written."""
    rng = np.random.default_rng(2)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((64, 256), (256, 10)))
    inits = [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")]
    nodes = [
        onnx.helper.make_node("MatMul", ["x", "w1"], ["h"]),
        onnx.helper.make_node("Relu", ["h"], ["r"]),
        onnx.helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "mlp",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.save_model(model, str(path), save_as_external_data=True, location="mlp.weights", size_threshold=0)
    return path


@pytest.mark.parametrize("target", ["onnxruntime", "tvm"])
def test_onnx_source_with_external_data(target: str, tmp_path: Path) -> None:
    """The graph and its weights file are both read (the graph alone has no weights); the artifact computes
    what ONNX Runtime computes on the source."""
    (tmp_path / "src").mkdir()
    source = _external_data_model(tmp_path / "src" / "mlp.onnx")
    assert (source.parent / "mlp.weights").stat().st_size == (64 * 256 + 256 * 10) * 4
    assert all(
        t.data_location == onnx.TensorProto.EXTERNAL
        for t in onnx.load(str(source), load_external_data=False).graph.initializer
    )
    result = quick_build(str(source), tmp_path / "out", target=target)
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(load(result.path).run({"x": x})["y"], expected, rtol=1e-5, atol=1e-5)


def test_weight_only_on_a_cpu_without_vnni_takes_nothing_and_says_why() -> None:
    """tvm's weight-only kernels need AVX-512 VNNI: for a CPU without it (``--target-opt mcpu=skylake-avx512``)
    every matmul stays as it was, counted under that reason, and nothing is packed."""
    import tvm
    from tvm import relax
    from tvm.target import codegen

    from aotforge.targets.tvm.rewrites.weight_only import WeightOnlyFormat, weight_only_matmuls

    assert not codegen.target_has_features("avx512vnni", tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))
    assert codegen.target_has_features("avx512vnni", tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}))
    bb = relax.BlockBuilder()
    x_var = relax.Var("x", relax.TensorType((2, 64), "float32"))
    w_var = relax.Var("w", relax.TensorType((64, 32), "float32"))
    with bb.function("main", [x_var, w_var], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x_var, w_var))
        bb.emit_func_output(y)
    before = bb.get()
    w = np.ones((64, 32), np.float32)
    mod, packed, report = weight_only_matmuls(before, lambda _n: w, WeightOnlyFormat(4, 32), False, "skylake-avx512")
    assert packed == {} and report["matmuls_taken"] == 0
    assert "target skylake-avx512 has no avx512vnni" in json.dumps(report)
    tvm.ir.assert_structural_equal(mod, before)


def test_minilm_int8_recipe_is_a_build_its_passes_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """``examples/minilm_int8.toml`` as ``compile --recipe`` reads it, by default (its build and quality on unseen
    sentences: the slow test below): its options fill the build's, each pass takes its options, and its calibration
    and evaluation callables give that many feeds of MiniLM's two integer inputs."""
    from aotforge.compiler.options import BuildOptions
    from aotforge.compiler.recipe import load_recipe
    from aotforge.core.calibration import load_calibration
    from aotforge.passes import make_pass

    monkeypatch.chdir(ROOT)  # the recipe names its calibration callables relative to the repository root
    opts = BuildOptions.from_dict(load_recipe(EXAMPLES / "minilm_int8.toml"))
    assert opts.target == "onnxruntime" and opts.passes.names == ("optimize", "fuse-ort", "int8-dynamic")
    for name in opts.passes.names:
        make_pass(name, opts.passes.params.get(name))
    options = opts.passes.params["int8-dynamic"]
    inputs = {"input_ids": (2, np.dtype(np.int64)), "attention_mask": (2, np.dtype(np.int64))}
    for source, count in (
        (options["calibration_dir"], options["samples"]),
        (options["eval_dir"], options["eval_samples"]),
    ):
        feeds = load_calibration(source, inputs, count)
        assert len(feeds) == count and all(set(f) == set(inputs) for f in feeds), source


@pytest.mark.slow
def test_minilm_int8_recipe_keeps_the_embeddings_of_held_out_sentences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``examples/minilm_int8.toml`` as the README runs it: every projection int8 (QAttention where the recipe
    says), and on sentences the build never saw, the artifact's embeddings keep cosine >= the recipe's
    ``min_cosine`` against the fp32 PyTorch model's."""
    import torch

    from examples import minilm, minilm_sentences

    monkeypatch.chdir(ROOT)  # the recipe names its calibration callables relative to the repository root
    result = quick_build(str(EXAMPLES / "minilm.py"), tmp_path, recipe=EXAMPLES / "minilm_int8.toml")
    graph = onnx.load(str(result.path / "model.onnx"), load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert "QAttention" in ops and "MatMul" not in ops, ops
    sentences = minilm_sentences._make(200, 16)  # verbs neither the calibration nor the evaluation set uses
    assert not set(sentences) & set(minilm_sentences.CALIBRATION + minilm_sentences.EVALUATION)
    batch = minilm.tokenize(sentences, seq=128)
    with torch.no_grad():
        expected = minilm.get_model().eval()(batch["input_ids"], batch["attention_mask"]).numpy()
    artifact = load(result.path)
    got = np.concatenate(
        [artifact.run({k: v[i : i + 1].numpy() for k, v in batch.items()})["embedding"] for i in range(len(sentences))]
    )
    cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.mean() >= 0.995 and cosines.min() >= 0.99, cosines


#: Each capability the README (or a docs/ page it links) claims, in its words, and the tests that fail without it.
README_CLAIMS = {
    "verifies every file's sha256 first": ["test_cli.py::test_verify_passes_then_catches_tampering"],
    "Every build is validated against the source model": ["test_errors.py::test_validation_failure_leaves_no_artifact"],
    "--sample-inputs FILE.npz|DIR": ["test_sample_inputs.py::test_sample_inputs_validate_and_benchmark"],
    "an undeclared one is never silently bound to 1": [
        "test_dim_defaults.py::test_a_dim_with_no_default_is_refused_by_name"
    ],
    "checks greedy generation token for token against transformers": [
        "test_generative_targets.py::test_llama_directory_batch_is_token_exact_against_transformers",
    ],
    "--max-perplexity-increase": [
        "test_decoder_quality.py::test_a_build_over_the_quality_budget_fails_and_names_the_knobs"
    ],
    "continuous batching": ["test_runtime.py::test_requests_arriving_mid_run_are_token_exact"],
    "prefilled in chunks": ["test_runtime.py::test_prompts_prefill_in_chunks_within_the_token_budget"],
    "reuses its cached prefix": ["test_runtime.py::test_a_shared_prefix_is_computed_once"],
    "`/metrics` speaks Prometheus": ["test_server.py::test_metrics_agree_with_what_the_client_sent"],
    "aotforge promote": ["test_local_registry.py::test_promotion_refusal_names_each_failed_gate"],
    "aotforge verify": ["test_signing.py::test_one_flipped_byte_in_any_file_is_refused"],
    "OpenSSF model signing": ["test_openssf_signing.py::test_model_signing_verifies_an_aotforge_signature"],
    "MLflow": ["test_mlflow_registry.py::test_push_is_idempotent_and_pull_verifies"],
    "A failed build leaves nothing behind": ["test_errors.py::test_user_error_is_one_line_and_leaves_nothing"],
    "reports in seconds which ops a target takes": [
        "test_tvm_importable.py::test_check_command_names_what_tvm_takes_and_what_it_cannot"
    ],
    "--dump-ir": ["test_readme_claims.py::test_dump_ir_writes_the_graph_after_each_pass_and_the_last_is_the_artifacts"],
    "examples/minilm_int8.toml": ["test_readme_claims.py::test_minilm_int8_recipe_is_a_build_its_passes_take"],
    "--max-runs": ["test_readme_claims.py::test_bench_max_runs_caps_the_timed_calls"],
    "Speculative decoding": ["test_speculative.py::test_greedy_speculative_is_the_targets_greedy"],
    "`aotforge distill` trains a draft": [
        "test_distill.py::test_the_student_compiles_into_a_draft_speculative_decoding_uses"
    ],
    "`aotforge distill-draft` a feature draft": [
        "test_feature_draft_training.py::test_the_cli_writes_the_specs_directory",
        "test_feature_draft.py::test_greedy_with_a_feature_draft_is_plain_greedy",
    ],
    "a GGUF file": ["test_gguf_source.py::test_cli_compiles_an_fp16_gguf_without_task_and_refuses_a_broken_one"],
    "`--tensor-parallel N`, `--pipeline-parallel M`": [
        "test_tensor_parallel.py::test_rank_artifacts_generate_token_exact_like_transformers",
        "test_pipeline_parallel.py::test_stage_artifacts_generate_token_exact_like_transformers",
    ],
    "`--tensor-parallel N` ranks a GPU each": [
        "test_tensorrt_ranks.py::test_a_tensor_parallel_bundle_carries_each_ranks_graphs_plans_and_cpu_check",
        "test_tensorrt_ranks.py::test_a_tensor_parallel_bundle_finishes_on_onnxruntime_token_exact",
    ],
}


def _marked_slow(node: Any) -> bool:
    """Whether a decorator or ``pytestmark`` value is ``pytest.mark.slow`` (a slow case of a parametrization is not)."""
    import ast

    return any(isinstance(n, ast.Attribute) and n.attr == "slow" for n in ast.walk(node)) and not isinstance(
        node, ast.Call
    )


def test_each_readme_claim_names_tests_that_exist() -> None:
    """The claims above are in the README or docs/ (rewording one must update this map), and the tests exist and
    run by default: neither the test nor its file is marked slow."""
    import ast

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    readme = " ".join(" ".join(p.read_text() for p in pages).split())  # a claim may wrap over lines
    for claim, tests in README_CLAIMS.items():
        assert claim in readme, f"README no longer says {claim!r}: update README_CLAIMS"
        for test in tests:
            file, name = test.split("::")
            tree = ast.parse((ROOT / "tests" / file).read_text())
            functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            assert name in functions, f"{claim!r}: {test} does not exist"
            marks = [
                *functions[name].decorator_list,
                *(a.value for a in tree.body if isinstance(a, ast.Assign) and "pytestmark" in ast.unparse(a)),
            ]
            assert not any(_marked_slow(m) for m in marks), f"{claim!r}: {test} is slow, not in the default run"
