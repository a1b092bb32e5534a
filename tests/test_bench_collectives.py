"""tools/bench_collectives.py: its rank pair runs gloo between two network namespaces (the stand-in for two hosts) and
sums right, and its result file renders on the benchmarks page with the sizing model's predictions beside it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.ray_scenario import SKIP
from tests.test_bench_page import _tool

bench_collectives = _tool("bench_collectives")
bench_page = _tool("bench_page")
bench_record = _tool("bench_record")
two_hosts = _tool("two_hosts")


def _results() -> dict[str, Any]:
    """A result file's ``results`` as ``measure`` writes them, with round figures the model's sums can be read off."""
    bc = bench_collectives
    link = {"allreduce_us": {"1": 50.0, "2": 60.0, "4": 70.0, "8": 90.0}, "in_ort_us": 100.0, "gather_us": 1000.0}
    capped = {**link, "allreduce_us": {"1": 70.0, "2": 100.0, "4": 150.0, "8": 250.0}}
    return {
        "cpus": 2, "hidden": 576, "vocab": 49152, "degree": 2, "batches": [1, 2, 4, 8], "rate_mbit": 1000.0,
        "collectives": {bc.SHM: [link], bc.LOOPBACK: [link], bc.VETH: [link, link], bc.rate_link(1000.0): [capped]},
        "decode": {
            bc.UNSHARDED: [{"itl_ms": 40.0, "p90_itl_ms": 41.0}],
            bc.TP_LOOPBACK: [{"itl_ms": 48.0, "p90_itl_ms": 50.0, "same_tokens_on_every_rank": True, "tokens": [1]}],
            bc.TP_VETH: [{"error": "a round that failed is left out"}],
        },
        "skipped": {"tc netem delay": "tc netem: unknown qdisc"},
    }  # fmt: skip


def test_the_result_file_renders_with_the_model_beside_the_measurements(tmp_path: Path) -> None:
    results = _results()
    run = bench_record.start({"rounds": 1})
    bench_record.write(tmp_path / "collectives.json", "collectives", run, bench_collectives.tables(results), results)
    page = bench_page.render(tmp_path)
    assert "## Collectives on one host and across two" in page
    assert (
        "| gloo, veth (two namespaces) | 50.0 (2 rounds) | 60.0 (2 rounds) | 70.0 (2 rounds) | 90.0 (2 rounds) |"
        in page
    )
    # The capped link's all-reduce: the plain veth's plus [1, 576] floats at 1000 Mbit/s (18.4 us).
    assert "| all-reduce of [1, 576] at 1000 Mbit/s, us | 68.4 | 70.0 |" in page
    # The loopback decode: 40 ms on 2 cores over 2 ranks, 61 all-reduces of 0.1 ms, one 1 ms gather.
    assert "| tensor-parallel 2, gloo over loopback: ITL ms | 47.1 | 48.0 |" in page
    assert "tc netem delay (tc netem: unknown qdisc)" in page
    assert "Not run yet: `make bench-collectives`." not in page


@pytest.mark.skipif(SKIP is not None or bool(two_hosts.unavailable()), reason=SKIP or two_hosts.unavailable())
def test_gloo_sums_right_between_two_namespaces_and_leaves_nothing_behind() -> None:
    """One rank in each namespace, each bound to its end of the veth pair; afterwards no veth is left here."""
    got = bench_collectives.pair_on(bench_collectives.VETH, ["--child", "collectives", "--calls", "10"], 0.0)
    assert got.get("sums_right") is True, got
    assert set(got["allreduce_us"]) == {"1", "2", "4", "8"} and got["in_ort_us"] > 0 and got["gather_us"] > 0
    links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    assert not set(two_hosts.DEVICES) & {link["ifname"] for link in json.loads(links)}
