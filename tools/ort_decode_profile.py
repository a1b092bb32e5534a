"""One ONNX Runtime decode graph's step, bare: p50 wall and CPU ms per step, then each op type's kernel time.

    python tools/ort_decode_profile.py MODEL.onnx [--threads 2] [--steps 200] [--position 130] [--top 12]
        [--max-len 192] [--no-kernels] [--by-weight] [--config session.intra_op.spin_duration_us=20 ...] [--json OUT]

MODEL.onnx is an aotforge onnxruntime text-generation artifact's ``decode.onnx`` (inputs ``input_ids``,
``position_ids``, ``write_pos``, ``past_key_<i>`` ...) or ONNX Runtime GenAI's ``model.onnx`` (``input_ids``,
``attention_mask``, ``past_key_values.<i>.key`` ...; its cache shared between past and present, as GenAI runs
it). Both run the same way: every input and output bound once over numpy buffers (the cache ``[1, kv_heads,
--max-len, head_dim]``, bound as past and present), ``--steps`` steps at cache position ``--position``, in a
plain session at ``--threads`` intra-op threads and ORT's default optimization. Without the runners' Python or
GenAI's C++ around the step, the difference left is the graph's. Kernel times come from a second session with
ORT's profiler on (``SessionOptions.enable_profiling``), summed per op type over the same steps. ``--config``
adds session config entries to both sessions (e.g. the thread pool's spin, which the artifacts set through the
onnxruntime target option ``intra_op_spin_us``). ``--by-weight`` also lists the kernels by op type and constant
weight shape (q/k/v, o, gate/up, down, head), each kernel's median time times its count per step and the
weight bytes it streams per second at that median: the GEMVs' rate against the bandwidth floor
(``bandwidth_floor.py``), kernel for kernel between two graphs.

Time two graphs in alternating processes (the machine is shared): one run of this tool per graph.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

#: SmolLM-135M's head size (576 / 9), for a cache whose last dim the graph leaves symbolic.
HEAD_DIM = 64


def bound_step(session: Any, max_len: int, position: int) -> tuple[Any, Any]:
    """An I/O binding of every input and output of ``session``'s decode graph, and a closure running one step."""
    import onnxruntime as ort

    binding = session.io_binding()
    caches: dict[str, np.ndarray] = {}
    for value in session.get_inputs():
        name, shape = value.name, value.shape
        if name.startswith("past"):
            head_dim = shape[3] if isinstance(shape[3], int) else HEAD_DIM  # GenAI's is symbolic (kv_cache_dim)
            array = np.zeros((1, shape[1], max_len, head_dim), dtype=np.float32)
            caches["present" + name.removeprefix("past_key_values").removeprefix("past")] = array
        elif name == "attention_mask":
            array = np.ones((1, position + 1), dtype=np.int64)
        elif name == "write_pos":
            array = np.full(1, position, dtype=np.int64)
        elif name in ("input_ids", "position_ids"):
            array = np.full((1, 1), position if name == "position_ids" else 7, dtype=np.int64)
        else:
            raise SystemExit(f"{name}: an input this tool does not know (neither an aotforge nor a GenAI decode graph)")
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
    for value in session.get_outputs():
        name = value.name
        cache = caches.get(name)  # present_key_<i> / present.<i>.key: the past input's buffer
        if cache is None:  # logits: [1, vocab] or [1, 1, vocab]
            vocab = value.shape[-1]
            cache = np.empty((1, vocab) if len(value.shape) == 2 else (1, 1, vocab), dtype=np.float32)
        binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(cache))
    return binding, lambda: session.run_with_iobinding(binding)


def session_options(threads: int, config: dict[str, str]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    return options


def step_times(model: Path, options: Any, max_len: int, position: int, steps: int) -> dict[str, float]:
    """p50 / min wall ms and p50 CPU ms of one decode step, after 10 warm-up steps."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), options, ["CPUExecutionProvider"])
    _, step = bound_step(session, max_len, position)
    for _ in range(10):
        step()
    wall, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return {
        "wall_p50_ms": round(float(np.median(wall)) * 1e3, 3),
        "wall_min_ms": round(min(wall) * 1e3, 3),
        "cpu_p50_ms": round(float(np.median(cpu)) * 1e3, 3),
    }


def weight_shapes(model: Path) -> dict[str, tuple[int, ...]]:
    """Each node's constant 2-D weight shape (its first such input), by node name."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer if len(init.dims) == 2}
    inputs = {node.name: [shapes[name] for name in node.input if name in shapes] for node in graph.node}
    return {name: found[0] for name, found in inputs.items() if found}


def by_weight(events: list[dict[str, Any]], start: int, steps: int, shapes: dict[str, tuple[int, ...]]) -> list[Any]:
    """``[op, weight shape, kernels per step, median kernel ms x count, weight GB/s at the median]``, slowest first."""
    durations: dict[tuple[str, tuple[int, ...]], list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            node = e["name"].removesuffix("_kernel_time")
            durations[(e.get("args", {}).get("op_name", "?"), shapes.get(node, ()))].append(e["dur"] / 1e3)
    rows = []
    for (op, shape), ms in durations.items():
        count = len(ms) // steps
        total = float(np.median(ms)) * count
        streams = op in ("MatMul", "Gemm") and shape and total  # reads all of its fp32 weight (a Gather: one row)
        rate = float(np.prod(shape)) * 4 * count / total / 1e6 if streams else 0.0
        rows.append([op, list(shape), count, round(total, 3), round(rate, 1)])
    return sorted(rows, key=lambda row: -row[3])


def kernel_times(
    model: Path, options: Any, max_len: int, position: int, steps: int, weights: bool = False
) -> dict[str, Any]:
    """Per op type: ms per step inside its kernels and kernels per step, from ORT's profiler (``weights``: and
    per op type and weight shape, ``by_weight``)."""
    import onnxruntime as ort

    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "decode")
        session = ort.InferenceSession(str(model), options, ["CPUExecutionProvider"])
        _, step = bound_step(session, max_len, position)
        for _ in range(steps + 10):
            step()
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    kept = sorted(e["ts"] for e in runs)[10:]  # the timed steps: after the warm-up
    start = kept[0] if kept else 0
    per_op: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] += e["dur"] / 1e3 / steps
            count[op] += 1
    run_ms = float(np.median([e["dur"] for e in runs[10:]])) / 1e3 if len(runs) > 10 else float("nan")
    result = {
        "run_p50_ms": round(run_ms, 3),
        "kernels_ms": round(sum(per_op.values()), 3),
        "kernels_per_step": round(sum(count.values()) / steps, 1),
        "ops": {op: [round(ms, 3), count[op] // steps] for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1])},
    }
    if weights:
        result["by_weight"] = by_weight(events, start, steps, weight_shapes(model))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--position", type=int, default=130)
    parser.add_argument("--max-len", type=int, default=192)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--no-kernels", action="store_true", help="time the steps only, no profiled session")
    parser.add_argument("--by-weight", action="store_true", help="kernels by op and weight shape, GB/s each")
    parser.add_argument("--config", action="append", default=[], help="KEY=VALUE: a session config entry")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    config = dict(entry.split("=", 1) for entry in args.config)
    result: dict[str, Any] = {"model": str(args.model), "load": os.getloadavg()[0], "config": config}
    result |= step_times(args.model, session_options(args.threads, config), args.max_len, args.position, args.steps)
    if not args.no_kernels:
        options = session_options(args.threads, config)
        result |= kernel_times(args.model, options, args.max_len, args.position, args.steps, args.by_weight)
    print(f"{args.model} {config or ''}")
    print(f"  step wall p50 {result['wall_p50_ms']} ms (min {result['wall_min_ms']}), "
          f"CPU p50 {result['cpu_p50_ms']} ms, load {result['load']:.1f}")  # fmt: skip
    if "ops" in result:
        print(f"  profiled run p50 {result['run_p50_ms']} ms, kernels {result['kernels_ms']} ms "
              f"({result['kernels_per_step']} per step)")  # fmt: skip
        for op, (ms, n) in list(result["ops"].items())[: args.top]:
            print(f"  {op:36s} {ms:8.3f} ms  x{n}")
    for op, shape, n, ms, rate in result.get("by_weight", [])[: args.top]:
        print(f"  {op:24s} {str(shape):14s} x{n:<3d} {ms:8.3f} ms (median kernel x{n}) {rate:6.1f} GB/s of weights")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
