"""Two stand-in hosts on one machine: two private network namespaces joined by a veth pair (root only).

Each "host" is a namespace held open by a ``sleep`` that ``unshare -n`` started (no named namespace, no
interface of the machine's own network touched): when the holders are killed the namespaces, and the veth
pair with them, are gone. Commands run in a host through ``nsenter -t HOLDER -n``. The link can be shaped:
``rate_mbit`` puts a token bucket (``tc qdisc ... tbf``, a one-packet burst) on both ends' egress, so each
byte costs what it would on a link of that rate; a delay needs ``netem``, which not every kernel has (then
:func:`unavailable` says so and the bench records it). The tests' Ray clusters use one namespace and loopback
(``tests/ray_cluster.py``); this is the two-sided variant a network's latency and bandwidth can enter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

#: The pair's addresses: a private /30 nothing else on a test machine uses.
ADDRESSES = ("10.231.0.1", "10.231.0.2")
DEVICES = ("afa", "afb")


def unavailable() -> str:
    """Why two namespaces cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and a veth pair)"
    missing = [tool for tool in ("unshare", "nsenter", "ip", "tc") if not shutil.which(tool)]
    return f"needs {', '.join(missing)} (util-linux, iproute2)" if missing else ""


def netem_missing() -> str:
    """Why ``tc ... netem delay`` cannot run here ('' when it can): it is a kernel module some kernels leave out."""
    with hosts() as pair:
        run = subprocess.run(
            pair.command(0, ["tc", "qdisc", "add", "dev", DEVICES[0], "root", "netem", "delay", "1ms"]),
            capture_output=True,
            text=True,
        )
    return "" if run.returncode == 0 else f"tc netem: {run.stderr.strip() or run.returncode} (this kernel's sch_netem)"


@dataclass
class Hosts:
    """The two namespaces' holder processes; ``command(h, argv)`` runs ``argv`` in host ``h`` (0 or 1)."""

    holders: tuple[int, int]

    def command(self, host: int, argv: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.holders[host]), "-n", *argv]

    def run(self, host: int, *argv: str) -> None:
        subprocess.run(self.command(host, list(argv)), check=True, capture_output=True, text=True)


@contextlib.contextmanager
def hosts(rate_mbit: float = 0.0) -> Iterator[Hosts]:
    """Two namespaces, ``ADDRESSES[h]`` on host ``h``'s end of the veth pair, loopback up in each."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    holders = [subprocess.Popen(["unshare", "-n", "sleep", "86400"]) for _ in range(2)]
    try:
        pair = Hosts((holders[0].pid, holders[1].pid))
        _wait_unshared(pair)
        pair.run(0, "ip", "link", "add", DEVICES[0], "type", "veth", "peer", "name", DEVICES[1])
        pair.run(0, "ip", "link", "set", DEVICES[1], "netns", str(holders[1].pid))
        for h in (0, 1):
            pair.run(h, "ip", "link", "set", "lo", "up")
            pair.run(h, "ip", "addr", "add", f"{ADDRESSES[h]}/30", "dev", DEVICES[h])
            pair.run(h, "ip", "link", "set", DEVICES[h], "up")
            if rate_mbit:
                shape = ["tbf", "rate", f"{rate_mbit}mbit", "burst", "1600", "latency", "200ms"]
                pair.run(h, "tc", "qdisc", "add", "dev", DEVICES[h], "root", *shape)
        yield pair
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def _wait_unshared(pair: Hosts) -> None:
    """Until both holders run in namespaces of their own (``unshare`` execs ``sleep`` once it made one)."""
    mine = os.readlink("/proc/self/ns/net")
    for _ in range(200):
        with contextlib.suppress(OSError):
            if all(os.readlink(f"/proc/{pid}/ns/net") != mine for pid in pair.holders):
                return
        time.sleep(0.05)
    raise RuntimeError("unshare -n did not make a network namespace within 10 s")
