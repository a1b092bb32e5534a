"""The ``tvm`` target's options, the LLVM target they name, and the checks tuning needs of them."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path
from typing import Any

from aotforge.core.errors import OptionsError
from aotforge.targets.tvm.host import AMX_MATTR, amx_usable, host_cpu


@dataclasses.dataclass(frozen=True)
class TvmOptions:
    """LLVM code generation settings. Empty strings mean: detect this host."""

    mcpu: str = ""
    mtriple: str = ""
    num_cores: int = 0
    fast_math: bool = True
    dynamic: bool = False
    #: C compiler for a cross build (e.g. ``aarch64-linux-gnu-gcc``); empty: the host's gcc.
    cc: str = ""
    #: MetaSchedule trials in total (0: no search, default schedules only); see targets.tvm.tuning.tune.
    tune_trials: int = 0
    #: Wall-clock cap on the search in minutes (0: none); alone, only the clock ends the search.
    tune_minutes: float = 0.0
    #: Tuning store directory; empty: ``<--cache-dir>/tvm-tuning``, or nothing kept without a cache dir.
    tuning_db: str = ""
    #: Shape buckets per dim, ``dim=a/b/c`` (e.g. ``seq=32/64/128``); empty: the defaults of targets.tvm.buckets.
    buckets: tuple[str, ...] = ()
    #: The most buckets a build compiles (each is a full compile of the model).
    max_buckets: int = 8
    #: Text generation: read the weights at load into memory on 2 MiB transparent huge pages
    #: (``tvm/decoder/weight_file.read_weights``); a batch-1 decode step streams every weight.
    huge_pages: bool = True

    def __post_init__(self) -> None:
        if self.tune_trials < 0 or self.tune_minutes < 0:
            raise OptionsError(
                f"tvm: tune_trials ({self.tune_trials}) and tune_minutes ({self.tune_minutes}) must be >= 0 (0 = off)"
            )

    @property
    def tuning(self) -> bool:
        return self.tune_trials > 0 or self.tune_minutes > 0


#: The tuning store's folder inside the build cache directory.
TUNING_DIR = "tvm-tuning"


def check_tunable(options: TvmOptions) -> None:
    """Tuning times candidates on this host, so it must be the CPU the artifact is for."""
    if options.dynamic:
        raise OptionsError("tvm: tune_trials/tune_minutes need static shapes: drop dynamic=true to tune")
    here = host_cpu()
    arch = options.mtriple.split("-")[0]
    if (options.mcpu and options.mcpu != here) or (arch and arch != platform.machine()):
        raise OptionsError(
            f"tvm: tuning measures candidates on this host ({here}, {platform.machine()}), not on "
            f"mcpu={options.mcpu or here} mtriple={options.mtriple or '(host)'}: tune on a host with that CPU, "
            "or build without tune_trials"
        )


def tune_settings(options: TvmOptions, work_dir: Path) -> Any:
    """The tuning run ``options`` ask for, working in ``work_dir``; ``None`` without tuning."""
    if not options.tuning:
        return None
    from aotforge.targets.tvm.tuning.tune import TuneSettings

    return TuneSettings(
        trials=options.tune_trials,  # 0 with tune_minutes: the clock only (TuneSettings)
        minutes=options.tune_minutes,
        work_dir=work_dir,
        store_dir=Path(options.tuning_db) if options.tuning_db else None,
    )


def target_dict(options: TvmOptions) -> dict[str, Any]:
    """The dict form TVM 0.27 needs (its ``"llvm -mcpu=..."`` string form is rejected)."""
    import tvm

    host = tvm.target.Target.from_device("cpu")
    target = {
        "kind": "llvm",
        "mcpu": options.mcpu or host_cpu(),
        "mtriple": options.mtriple or str(host.attrs["mtriple"]),
        "num-cores": options.num_cores or (os.cpu_count() or 1),
    }
    # AMX int8 tiles where the host has them and its OS grants them (LLVM's host CPU name may not
    # include them: a Xeon with AMX reads as "rocketlake" here); never for an mcpu the user named.
    if not options.mcpu and amx_usable():
        target["mattr"] = list(AMX_MATTR)
    return target
