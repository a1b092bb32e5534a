"""What ONNX Runtime's own GEMVs need for one fp32 decode step of the SmolLM-135M shape, with nothing else.

A graph of only the step's weight MatMuls (``x [1, 1, K] @ W [K, N]``: q/k/v packed, o, gate/up packed or
apart, down, per layer, and the head), random weights of the same 538 MB, run at THREADS threads with I/O
binding: its time is what MLAS needs to stream the weights, the part of a decode step no graph rewrite
removes. Printed beside the numpy two-thread read floor of the same bytes (``bandwidth_floor``): a decode
step cannot go below the first in ONNX Runtime, nor below the second in any fp32 runtime.

    python tools/gemv_floor.py [--work /tmp/gemv-floor] [--layers 30] [--unpacked] [--runs 100]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from bandwidth_floor import read_bandwidth_gbs  # tools/, beside this script
from bench_generation import SMOLLM, THREADS


def weight_shapes(layers: int, packed: bool) -> list[tuple[int, int]]:
    """``[K, N]`` of every MatMul weight a decode step reads (the head last)."""
    hidden, inner = SMOLLM["hidden_size"], SMOLLM["intermediate_size"]
    head_dim = hidden // SMOLLM["num_attention_heads"]
    qkv = (SMOLLM["num_attention_heads"] + 2 * SMOLLM["num_key_value_heads"]) * head_dim
    gate_up = [(hidden, 2 * inner)] if packed else [(hidden, inner)] * 2
    return [s for _ in range(layers) for s in [(hidden, qkv), (hidden, hidden), *gate_up, (inner, hidden)]] + [
        (hidden, SMOLLM["vocab_size"])
    ]


def save_graph(path: Path, shapes: list[tuple[int, int]]) -> None:
    """One MatMul per weight, each reading the input of its width, every output a graph output (none is dead)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    widths = sorted({k for k, _ in shapes})
    nodes, weights, outputs = [], [], []
    for index, (k, n) in enumerate(shapes):
        weights.append(numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32) * 0.02, f"w{index}"))
        nodes.append(helper.make_node("MatMul", [f"x{k}", f"w{index}"], [f"y{index}"]))
        outputs.append(helper.make_tensor_value_info(f"y{index}", TensorProto.FLOAT, [1, 1, n]))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, 1, k]) for k in widths]
    graph = helper.make_graph(nodes, "decode_gemvs", inputs, outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, location=path.name + ".data")


def time_graph(path: Path, widths: list[int], runs: int) -> tuple[list[float], list[float]]:
    """Wall and process CPU seconds of each run after a warm-up."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = ort.InferenceSession(str(path), options, ["CPUExecutionProvider"])
    binding = session.io_binding()
    for k in widths:
        binding.bind_cpu_input(f"x{k}", np.ones((1, 1, k), dtype=np.float32))
    for output in session.get_outputs():
        binding.bind_output(output.name)
    for _ in range(5):
        session.run_with_iobinding(binding)
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        session.run_with_iobinding(binding)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-gemv-floor"))
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--unpacked", action="store_true", help="gate and up apart (GenAI's graph), not packed")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    shapes = weight_shapes(args.layers, packed=not args.unpacked)
    path = args.work / f"gemvs-{args.layers}-{'unpacked' if args.unpacked else 'packed'}.onnx"
    if not path.is_file():
        save_graph(path, shapes)
    wall, cpu = time_graph(path, sorted({k for k, _ in shapes}), args.runs)
    nbytes = sum(k * n * 4 for k, n in shapes)
    bandwidth = read_bandwidth_gbs(THREADS)
    print(
        f"{len(shapes)} GEMVs over {nbytes / 1e6:.0f} MB, {THREADS} threads: wall p50 {np.median(wall) * 1e3:.2f} ms, "
        f"min {min(wall) * 1e3:.2f} ms, CPU p50 {np.median(cpu) * 1e3:.2f} ms ({nbytes / np.median(wall) / 1e9:.1f} "
        f"GB/s); numpy {THREADS}-thread read {bandwidth:.1f} GB/s: floor {nbytes / bandwidth / 1e6:.2f} ms"
    )


if __name__ == "__main__":
    main()
