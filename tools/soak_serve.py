"""A soak of ``aotforge serve`` (``aotforge/server/soak.py``): 1,000 requests with disconnects and bad ones mixed in.

Starts ``aotforge serve ARTIFACT`` on 127.0.0.1 (asking for an API key, so that wrong keys can be sent), runs the
soak against it, and prints what each kind of request got, what the server holds afterwards and its resident
memory over the soak; exits 1 if a good request failed, a bad one was answered with the wrong status, or the
server still holds a request or a KV block. ``--json FILE`` writes the report.

    python tools/soak_serve.py ARTIFACT [--requests 1000] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import bench_serve  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from aotforge.server.soak import SoakSpec, rss_growth_kib, soak

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path, help="a text-generation artifact directory")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=0, help="the server's (0: the artifact's max_batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    key = secrets.token_hex(8)
    log = Path("/tmp") / f"aotforge-soak-{key}.log"
    extra = ["--api-key", key, "--max-num-seqs", str(args.max_num_seqs)]
    with bench_serve.aotforge_process(args.artifact, log, extra) as (url, proc):
        spec = SoakSpec(url, args.requests, args.concurrency, api_key=key, seed=args.seed, pid=proc.pid)
        report = soak(spec)
    report["rss_growth_kib"] = rss_growth_kib(report)
    for kind, counts in sorted(report["by_kind"].items()):
        print(f"{kind:18} {counts['sent']:5} sent, {counts['problems']} problems")
    print(f"after: {report['after']}; RSS {report['rss_kib'][0][1]} -> {report['rss_kib'][-1][1]} KiB")
    print(f"RSS growth after the first fifth: {report['rss_growth_kib']} KiB; {report['seconds']} s")
    for problem in report["problems"]:
        print("problem:", problem)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 1 if report["num_problems"] or any(report["after"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
