"""The build cache's direct mode: serve a rebuild from the cache without running the frontend.

This module must stay light: a direct hit imports neither torch, onnx, onnxruntime nor tvm, so it
only reads files, hashes bytes and asks ``importlib.metadata``-style questions of the filesystem.

The direct key covers what decides the IR-level key before the frontend runs: the model file
(path and bytes) and the working directory, every build option but where the artifact goes
(``out``, ``name``, ``version``, ``cache_dir``), aotforge's own source, the installed
distributions (name, version and install time of each ``*.dist-info`` in site-packages, which
stand in for every file read from there: torch, transformers, onnx, tvm, model weight packages),
the Python version and the host CPU (which the targets' probes report). The files the build
read are checked against its entry (``artifacts.build_cache_direct``).

Out of scope, as in ccache: environment variables, the clock, random state and files whose
existence (not content) the model tests. A model file that depends on them should not be
built with ``--cache-dir``, or should read them from a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aotforge.artifacts import build_cache, build_cache_direct
from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.manifest import Manifest
from aotforge.artifacts.names import safe_name
from aotforge.artifacts.store import MODEL_FILE, staging_dir
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import build_record, place_artifact, store_artifact
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.read_tracker import Reads, tracked
from aotforge.core.decoder import PREFILL_FILE, TEXT_GENERATION
from aotforge.core.errors import ArtifactError

Progress = Callable[[str], None]
#: An IR-level entry holding one of these holds the IR it was compiled from: a whole artifact (a graph's; a decoder's,
#: or a sharded decoder's with one in each rank's or stage's folder).
IR_FILES = {MODEL_FILE, PREFILL_FILE}


def holds_ir(files: Iterable[str]) -> bool:
    """Whether an IR-level entry's ``files`` include the IR it was compiled from (:data:`IR_FILES`)."""
    return any(Path(f).name in IR_FILES for f in files)


#: Options that decide where the artifact goes, not what it holds.
_UNKEYED = ("out", "name", "version", "cache_dir", "export_cache_dir", "isolation.")


@dataclasses.dataclass
class DirectPlan:
    """The direct key of this build (None when direct mode does not apply) and what direct mode found."""

    key: str | None
    reason: str
    #: sha256 of each part of the key, stored with the entry so that a miss can name what changed.
    components: dict[str, str] = dataclasses.field(default_factory=dict)


def plan(model: Any, opts: BuildOptions) -> DirectPlan:
    if opts.cache_dir is None:
        return DirectPlan(None, "no --cache-dir")
    generative = opts.frontend.task == TEXT_GENERATION
    if not isinstance(model, (str, Path)) or not (Path(model).suffix in (".py", ".onnx") or generative):
        return DirectPlan(None, "direct mode needs a .py or .onnx model file (or a causal LM: a directory or file)")
    if opts.validation.sample_inputs is not None and not isinstance(opts.validation.sample_inputs, (str, Path)):
        return DirectPlan(None, "direct mode needs sample inputs as a file or directory, not arrays")
    if opts.prepare_only or opts.passes.dump_ir is not None:
        return DirectPlan(None, "direct mode is off for --prepare-only and --dump-ir")
    path = Path(model)
    if not (path.is_file() or (generative and path.is_dir())):
        return DirectPlan(None, f"{path} is not a file{' or directory' if generative else ''}")
    options = {k: v for k, v in opts.fields().items() if not k.startswith(_UNKEYED)}
    toolchain = toolchain_fingerprint()
    parts = {
        "source": [str(path.resolve()), tree_digest(path) if path.is_dir() else sha256_file(path)],
        "cwd": os.getcwd(),
        "options": options,
        "python": [toolchain["python"], toolchain["executable"]],
        "distributions": toolchain["distributions"],
        "aotforge_source": toolchain["aotforge_source"],
        "host": host_fingerprint(),
    }
    components = {name: _digest([build_cache_direct.SCHEMA_VERSION, value]) for name, value in parts.items()}
    return DirectPlan(_digest(sorted(components.items())), "", components)


def tree_digest(directory: Path) -> str:
    """sha256 over a model directory's files (path and bytes): a text-generation source is a directory."""
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(file.relative_to(directory).as_posix().encode() + b"\0" + sha256_file(file).encode())
    return digest.hexdigest()


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def serve(direct: DirectPlan, opts: BuildOptions, say: Progress) -> BuildResult | None:
    """The artifact from the cache on a direct hit; None (and ``direct.reason`` says why) otherwise."""
    started = time.perf_counter()
    assert direct.key is not None and opts.cache_dir is not None
    entry, direct.reason = build_cache_direct.lookup(opts.cache_dir, direct.key, direct.components)
    if entry is None:
        return None
    template = dict(entry.manifest)
    name = opts.name or str(template.get("name") or "")
    if not name:
        direct.reason = "direct entry names no artifact"
        return None
    place = place_artifact(opts.out, opts.name or safe_name(name), opts.version, opts.target, plots=False)
    with staging_dir(opts.out) as stage:
        hit = build_cache.lookup(opts.cache_dir, entry.key, stage)
        if hit is None or not holds_ir(hit.files):
            direct.reason = f"IR-level entry {entry.key[:12]} is missing or corrupt"
            return None
        cache = {
            "hit": True,
            "direct": True,
            "key": entry.key,
            "direct_key": direct.key,
            # Same files as the build that stored the entry, so its validation and benchmark stand.
            "reused": f"validation and benchmark of the build at {entry.built_at}",
        }
        try:
            manifest = Manifest.from_dict(
                {
                    **template,
                    "name": name,
                    "version": place.version,
                    "files": {},
                    "build": build_record(started, cache=cache),
                }
            )
        except ArtifactError:  # written by an aotforge with other manifest fields
            direct.reason = "direct entry's manifest has other fields than this aotforge's"
            return None
        direct.reason = "hit"
        for rel, png in entry.plots.items():  # the stored build's card plots: nothing is drawn here
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_bytes(png)
        say(f"cache hit (direct) {entry.key[:12]}: skipping the frontend, passes and {opts.target} compile")
        manifest = store_artifact(stage, manifest, place)
    return BuildResult(place.path_of(manifest), manifest)


def remember(
    direct: DirectPlan,
    reads: Reads,
    key: str,
    manifest: Manifest,
    source_name: str,
    opts: BuildOptions,
    stage: Path | None = None,
) -> None:
    """After a full build (before ``finalize``), store its direct entry; one that read an unhashable file gets none."""
    assert direct.key is not None and opts.cache_dir is not None
    if not holds_ir(build_cache.entry_files(opts.cache_dir, key)):
        direct.reason = f"{direct.reason}; IR-level entry {key[:12]} predates direct mode (no {MODEL_FILE})"
        return
    # The build's own outputs, and the export cache it may have read its graphs from: not its inputs.
    skip = tuple(str(p) for p in (opts.out, opts.cache_dir, opts.export_cache_dir) if p is not None)
    try:
        files = [build_cache_direct.record_file(p, reads.files[p]) for p in tracked(reads.files, skip=skip)]
    except build_cache_direct.NotCacheable as e:
        direct.reason = f"{direct.reason}; not direct-cacheable: {e}"
        return
    listings = {}
    for directory in tracked(reads.listings, skip=skip):
        digest = build_cache_direct.listing_digest(directory)
        if digest is None:
            direct.reason = f"{direct.reason}; not direct-cacheable: directory {directory} was listed but is gone"
            return
        listings[directory] = digest
    template = manifest.reproducible_part()
    for field in ("version", "files"):
        template.pop(field)
    template["name"] = source_name
    built_at = str(manifest.build.get("created_at", ""))
    plots = (
        {p.relative_to(stage).as_posix(): p.read_bytes() for p in sorted(stage.glob("plots/*.png"))} if stage else {}
    )
    build_cache_direct.store(
        opts.cache_dir, direct.key, direct.components, files, listings, key, template, built_at, plots
    )
    direct.reason = f"{direct.reason}; direct entry stored ({len(files)} files tracked)"


def toolchain_fingerprint() -> dict[str, Any]:
    """Python, aotforge's source, and every installed distribution, without importing any of them."""
    dists: dict[str, int] = {}
    paths = sysconfig.get_paths()
    for site in sorted({paths["purelib"], paths["platlib"]}):
        try:
            with os.scandir(site) as it:
                for e in it:
                    if e.name.endswith((".dist-info", ".egg-info")):
                        # A reinstall of the same version writes a new dist-info: a miss, never a stale hit.
                        dists[e.name] = e.stat().st_mtime_ns
        except OSError:
            continue
    return {
        "python": sys.version,
        # The interpreter, not the name it was started by (python, python3, a console script's shebang).
        "executable": [os.path.realpath(sys.executable), sys.prefix],
        "distributions": dists,
        "aotforge_source": aotforge_source_digest(),
    }


def aotforge_source_digest() -> str:
    """sha256 over aotforge's own modules: an edited pass or frontend must miss, and the version never changes."""
    package = Path(__file__).resolve().parents[1]  # the aotforge package, in a checkout or site-packages
    digest = hashlib.sha256()
    for file in sorted(package.rglob("*")):
        if file.suffix in (".py", ".j2") and "__pycache__" not in file.parts:
            digest.update(file.relative_to(package.parent).as_posix().encode() + b"\0")
            digest.update(file.read_bytes())
    return digest.hexdigest()


def host_fingerprint() -> dict[str, Any]:
    """The host facts the targets' probes report (CPU model and ISA flags, GPUs) without importing them."""
    cpu: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            field, _, value = line.partition(":")
            field = field.strip()
            if not field and cpu:
                break  # the first processor's block describes the host's CPU model
            if field in ("vendor_id", "model name", "flags", "cpu family", "model"):
                cpu[field] = value.strip()
    except OSError:
        pass
    try:
        gpu = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        gpu = ""
    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "nvidia": gpu,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
