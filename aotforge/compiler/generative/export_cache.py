"""The export stage's cache: a causal LM's exported graphs, kept apart from the target's compile.

The torch.onnx (dynamo) export is most of a small decoder's build, and its graphs do not depend on the passes,
the target's options or the validation that follow: a rebuild with other passes (``--precision int4`` after an
fp32 build), other target options (tvm's buckets, tuning) or another target that exports the same attention
reads the graphs back instead of exporting again. The IR-level cache (``artifacts.build_cache``) cannot serve
those: its key is the IR after the passes, and the target.

Each graph (prefill, decode, verify) is an entry of its own, so a build with a verify graph reads back the prefill
and decode graphs of one without. Its key covers what decides it: the model (its class, its config but where it was
loaded from, and every weight as exported, so a calibrated source keys as the weights it exports), the export
settings (the graph, the cache geometry, the decode attention; for a tensor- or pipeline-parallel build, which shard
of which split: the part is a function of the whole model and that tag) and the toolchain (Python, every installed
distribution, aotforge's own source: ``compiler.build_direct.toolchain_fingerprint``). An entry is an
``artifacts.build_cache`` entry under ``<export_cache_dir>``: the graph as ONNX with its weights beside it, every
file's sha256 checked on a hit; a corrupt one is deleted and exported again, never served. Builds that share
the directory export each entry once: the first takes the entry's lock (``<export_cache_dir>/.locks/<key>``), the
others wait on it and read what it stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts import build_cache
from aotforge.compiler.build_direct import toolchain_fingerprint
from aotforge.core.decoder import DecoderSpec
from aotforge.core.file_lock import locked

#: The subdirectory of the build cache that holds export entries when no export cache is named.
EXPORT_DIR = "export"
#: The subdirectory of an export cache that holds each entry's lock file.
LOCKS_DIR = ".locks"
#: Config fields that say where or by which version a model was saved, not what it computes.
_UNKEYED_CONFIG = ("_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype")


def export_cache_dir(export_dir: Path | None, cache_dir: Path | None) -> Path | None:
    """Where export entries go: the named directory, else ``<cache_dir>/export``, else nowhere."""
    if export_dir is not None:
        return Path(export_dir)
    return Path(cache_dir) / EXPORT_DIR if cache_dir is not None else None


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def model_digest(model: Any) -> str:
    """sha256 over the model's class, its config (but ``_UNKEYED_CONFIG``) and its weights with their dtypes."""
    digest = hashlib.sha256()
    cls = type(model)
    config = {k: v for k, v in model.config.to_dict().items() if k not in _UNKEYED_CONFIG}
    digest.update(f"{cls.__module__}.{cls.__qualname__}\0{_digest(config)}\0".encode())
    for key, tensor in sorted(model.state_dict().items()):
        array = tensor.detach().contiguous().cpu()
        digest.update(f"{key}\0{array.dtype}\0{tuple(array.shape)}\0".encode())
        digest.update(array.numpy().tobytes())
    return digest.hexdigest()


def key_components(
    model: Any,
    spec: DecoderSpec,
    attention: str,
    graph: str,
    shard: dict[str, Any] | None = None,
    outputs: Sequence[str] = (),
) -> dict[str, str]:
    """sha256 of each part of the key of ``graph``'s export (a file name: ``prefill.onnx``), by name; ``shard``
    tags a sharded build's part of ``model``, ``outputs`` names what the graph returns beyond its usual outputs."""
    return _components(model_digest(model), _digest(toolchain_fingerprint()), spec, attention, graph, shard, outputs)


def _components(
    model: str,
    toolchain: str,
    spec: DecoderSpec,
    attention: str,
    graph: str,
    shard: dict[str, Any] | None,
    outputs: Sequence[str],
) -> dict[str, str]:
    settings = {"spec": dataclasses.asdict(spec), "decode_attention": attention, "graph": graph}
    if outputs:  # left out when empty: the entries of graphs with only their usual outputs keep their keys
        settings["outputs"] = list(outputs)
    return {
        "model": model,
        "export": _digest({**settings, **({"shard": shard} if shard else {})}),
        "toolchain": toolchain,
    }


def cached_export(
    cache_dir: Path | None,
    model: Any,
    spec: DecoderSpec,
    attention: str,
    exports: Mapping[str, Callable[[], Any]],
    say: Callable[[str], None],
    shard: dict[str, Any] | None = None,
    extra_outputs: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Each graph of ``exports`` (``{file name: its export}``) as ``onnx_ir.Model``: read from ``cache_dir`` where an
    entry for this model, these settings and that graph exists, else exported, stored and read back. One entry a
    graph: a build that adds one (the verify graph) reads the others of an earlier build back.
    A sharded build's ``model`` is the whole source model and ``shard`` names the part the exports export (the
    kind, the degree, the shard's index and how it was split). ``extra_outputs`` names, by file name, what a graph
    returns beyond its usual outputs (a speculative build's ``hidden``), keyed apart from the graph without them."""
    import onnx_ir as ir

    if cache_dir is None:
        return {name: _reread(export()) for name, export in exports.items()}

    model_key, toolchain = model_digest(model), _digest(toolchain_fingerprint())
    cache_dir.mkdir(parents=True, exist_ok=True)
    graphs: dict[str, Any] = {}
    # Read and written in a scratch directory of the cache's own filesystem: an entry is copied, checked and
    # renamed into place whole (``build_cache.store``), and what a hit loads never points into the entry.
    with tempfile.TemporaryDirectory(prefix=".tmp-", dir=cache_dir) as scratch:
        for name, export in exports.items():
            outputs = (extra_outputs or {}).get(name, ())
            components = _components(model_key, toolchain, spec, attention, name, shard, outputs)
            key = _digest([[part, components[part]] for part in sorted(components)])
            work = Path(scratch) / name.removesuffix(".onnx")
            work.mkdir()
            graph = name.removesuffix(".onnx")
            # One export a key at a time: a build that wants a graph another build is exporting (two targets or
            # two workers from one model) waits for its entry instead of exporting it too.
            with locked(cache_dir / LOCKS_DIR / key):
                if build_cache.lookup(cache_dir, key, work) is not None:
                    what = f" of {shard['kind']} shard {shard['index']}" if shard else ""
                    say(f"export cache hit {key[:12]}: skipping the export{what} of the {graph} graph")
                else:
                    ir.save(export(), work / name, external_data=f"{name}.data")
                    files = [name, *([f"{name}.data"] if (work / f"{name}.data").is_file() else [])]
                    build_cache.store(cache_dir, key, components, work, files, {"graphs": [name]}, {})
            graphs[name] = _load(work / name)
    return graphs


def _reread(graph: Any) -> Any:
    """``graph`` as a hit reads it back. The exporter leaves the graph's name counters past its own names, and a
    graph read from ONNX starts them over; the passes and rewrites name what they add from those counters, so
    every build goes through the same round trip: an artifact's bytes do not depend on where its graphs came from.
    """
    import onnx_ir as ir

    return ir.serde.deserialize_model(ir.serde.serialize_model(graph))


def _load(path: Path) -> Any:
    """The graph at ``path`` with every weight in memory: the scratch directory it was read from goes away."""
    import onnx_ir as ir

    model = ir.load(os.fspath(path))
    ir.external_data.load_to_model(model)
    return model
