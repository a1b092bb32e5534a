"""Per-kernel time of a tvm artifact: where one call's time goes, kernel by kernel.

    TVM_NUM_THREADS=1 python tools/tvm_profile.py ARTIFACT [--runs 200] [--top 25] [--function main]

TVM 0.27's VM has no profiler; its instrument hook (``VirtualMachine.set_instrument``) sees every
call the VM makes with its arguments, so one run records them and each kernel is then timed alone
on its own arguments (warm caches: the sum is below the whole call, which also pays the VM's
dispatch and allocations, counted as builtins).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.sample_inputs import make_inputs
from aotforge.core.spec import IOSpec


def profile(artifact: Path, runs: int, function: str = "main") -> tuple[dict[str, float], dict[str, int], float]:
    """Best-batch microseconds per call of each kernel timed alone on the arguments one run gave it, its calls
    per run, and the plain p50 of the whole call in ms."""
    import tvm
    from tvm import relax

    manifest = read_manifest(artifact)
    io = IOSpec.from_dict(manifest.io)
    inputs = make_inputs(io, dict(manifest.validation["bound_dims"]), seed=0, count=1)[0]
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(artifact / "lib.so")), tvm.cpu())
    args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[s.name])) for s in io.inputs]
    for _ in range(20):
        vm[function](*args)
    plain = []
    for _ in range(runs):
        started = time.perf_counter()
        vm[function](*args)
        plain.append(time.perf_counter() - started)
    seen: dict[str, list[tuple[object, tuple[object, ...]]]] = collections.defaultdict(list)

    def instrument(func: object, symbol: str, before: bool, _ret: object, *call_args: object) -> int:
        if before:
            seen[symbol].append((func, call_args))
        return 0

    vm.set_instrument(instrument)
    vm[function](*args)
    vm.set_instrument(None)
    per_call = {}
    for symbol, calls in seen.items():
        if symbol.startswith("vm."):
            continue
        func, call_args = calls[0]
        for _ in range(10):
            func(*call_args)  # type: ignore[operator]
        per_call[symbol] = min(_batch_us(func, call_args, 20) for _ in range(max(runs // 20, 1)))
    return per_call, {k: len(v) for k, v in seen.items()}, float(np.median(plain)) * 1e3


def _batch_us(func: Any, call_args: tuple[object, ...], calls: int) -> float:
    """Mean microseconds per call over ``calls`` back-to-back calls (the caller keeps the best batch:
    on a shared machine, preemption only ever adds)."""
    started = time.perf_counter()
    for _ in range(calls):
        func(*call_args)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--function", default="main", help="the Relax function (a shape bucket's name)")
    args = parser.parse_args()
    per_call, calls, p50 = profile(args.artifact, args.runs, args.function)
    total = {k: per_call[k] * calls[k] for k in per_call}
    whole = sum(total.values())
    builtins = sum(v for k, v in calls.items() if k.startswith("vm."))
    print(f"p50 {p50:.3f} ms; {sum(calls.values())} calls ({builtins} VM builtins), kernels alone {whole:.0f} us")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{us:8.1f} us {100 * us / whole:5.1f}%  x{calls[name]:<3d} {name}")


if __name__ == "__main__":
    main()
