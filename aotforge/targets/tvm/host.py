"""Can this host run a tvm ``lib.so``? Its tvm runtime version and its CPU's instruction set.

A lib.so compiled for an ``mcpu`` with extensions this CPU lacks dies with SIGILL on the first
kernel that uses one; a lib.so from another tvm major.minor may not match the runtime's ABI.
Both are refused before the library is opened.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aotforge.core.cpu_flags import cpu_flags
from aotforge.core.errors import HostMismatchError

#: LLVM features that are instruction-set extensions code may use. LLVM's per-CPU feature lists also
#: hold tuning flags (``fast-*``, ``slow-*``, ``false-deps-*`` ...) that a host need not "have".
_ISA = re.compile(
    r"^(sse|ssse|avx|amx|fma|f16c|bmi|popcnt|lzcnt|movbe|aes|pclmul|vpclmulqdq|gfni|vaes|sha|adx"
    r"|neon|sve|sme|dotprod|i8mm|bf16|fullfp16|fp16fml)"
)
#: LLVM ``mattr`` for AMX int8 tiles (``kernels/amx_dense``)
AMX_MATTR = ("+amx-tile", "+amx-int8")
#: x86-64 Linux: ``SYS_arch_prctl``, ``ARCH_REQ_XCOMP_PERM``, ``XFEATURE_XTILEDATA``
ARCH_PRCTL = (158, 0x1023, 18)


def host_cpu() -> str:
    """The LLVM name of this host's CPU (``"skylake-avx512"``), what ``mcpu`` defaults to."""
    import tvm

    return str(tvm.get_global_func("target.llvm_get_system_cpu")())


def isa_features(target: Mapping[str, Any]) -> list[str]:
    """The instruction-set extensions LLVM enables for a ``{"kind": "llvm", "mcpu", "mtriple"}`` target."""
    import tvm
    from tvm.target import codegen

    keys = ("mcpu", "mtriple", "mattr")
    t = tvm.target.Target({"kind": "llvm", **{k: target[k] for k in keys if k in target}})
    return sorted(str(f) for f in codegen.llvm_get_cpu_features(t) if _ISA.match(str(f)))


@functools.cache
def amx_usable() -> bool:
    """Whether this host can run AMX int8 tiles: the CPU says ``amx_tile`` and ``amx_int8`` and the
    kernel grants this process the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, Linux 5.16+).

    Asked once per process (cached): the grant is process-wide and permanent, and it is what lets
    ``kernels/amx_dense`` run at all (that kernel does not ask itself)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    if not {"amxtile", "amxint8"} <= _cpuinfo_flags():
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).syscall(*ARCH_PRCTL)) == 0
    except (OSError, AttributeError):
        return False


def grant_amx(cpu_features: Iterable[str]) -> None:
    """Get this process the AMX tile state before a ``lib.so`` built with ``cpu_features`` runs, where they
    include amx-int8 (once per process: ``amx_usable``). A host that refuses it is refused by
    ``check_tvm_host`` before any load; here the answer only matters for its side effect."""
    if any(_norm(f) == "amxint8" for f in cpu_features):
        amx_usable()


def _cpuinfo_flags() -> set[str]:
    """The kernel's CPU flags, normalised like LLVM names without ``-_.``."""
    return {_norm(f) for f in cpu_flags()}


def _norm(feature: str) -> str:
    return re.sub(r"[-_.]", "", feature.lower())


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def check_tvm_host(manifest: Any) -> None:
    """Raise :class:`HostMismatchError` when this host cannot run ``manifest``'s lib.so."""
    import tvm

    built = manifest.target.info["target"]
    name = f"{manifest.name} v{manifest.version}"
    built_tvm = str(manifest.toolchain.get("tvm", ""))
    if built_tvm and _major_minor(built_tvm) != _major_minor(tvm.__version__):
        raise HostMismatchError(
            f"{name} was built with tvm {built_tvm} for {built['mcpu']}, this host has tvm {tvm.__version__}: "
            f"rebuild it here, or install apache-tvm {'.'.join(map(str, _major_minor(built_tvm)))}.*"
        )
    required = manifest.target.info.get("cpu_features") or isa_features(built)
    here = host_cpu()
    have = {_norm(f) for f in isa_features({"mcpu": here, "mtriple": built["mtriple"]})} | _cpuinfo_flags()
    missing = [f for f in required if _norm(f) not in have]
    if not missing and any(_norm(f) == "amxint8" for f in required) and not amx_usable():
        missing = ["amx-int8 (the OS refuses this process the AMX tile state)"]
    if missing:
        raise HostMismatchError(
            f"{name} was built with tvm {built_tvm or '?'} for mcpu {built['mcpu']}, this host has a {here} "
            f"lacking {', '.join(missing)}: rebuild it here (or with --target-opt mcpu={here}), "
            "or run it on a CPU with those features"
        )
