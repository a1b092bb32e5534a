"""What every decoder build does between its model and the graphs it saves, unsharded or one shard at a time: each
graph's export (through the export cache), then the graph passes between the target's own rewrites."""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from aotforge.compiler.build_plan import pass_entry
from aotforge.compiler.generative.export import export_decode, export_prefill, export_verify
from aotforge.compiler.generative.export_cache import cached_export
from aotforge.core.decoder import DECODE_FILE, GRAPH_ROLES, PREFILL_FILE, VERIFY_FILE, DecoderSpec
from aotforge.passes.manager import run_passes
from aotforge.targets.base import GenerativeBackend

Progress = Callable[[str], None]


def exported_graphs(
    cache_dir: Path | None,
    model: Any,
    spec: DecoderSpec,
    name: str,
    attention: str,
    speculative_k: int,
    say: Progress,
    *,
    hidden: bool = False,
    part: Any = None,
    prefill_scope: AbstractContextManager[Any] | None = None,
    shard: dict[str, Any] | None = None,
    what: str = "",
    files: Collection[str] | None = None,
) -> dict[str, Any]:
    """The prefill and decode graphs (and with ``speculative_k`` the verify graph) of ``model``, by file name, each
    exported where the cache has no entry for it. ``hidden``: prefill and verify also return the LM head's input.
    A shard exports ``part`` of ``model`` (which the cache keys, with the ``shard`` tag) and says ``what`` it is.
    ``files``: only those of the graphs (file names), in the same order."""
    source = model if part is None else part
    subject = f"{what}: the" if what else "the"

    def exporting(graph: str, export: Callable[..., Any], **extra: Any) -> Callable[[], Any]:
        def run() -> Any:
            say(f"exporting {subject} {graph}")
            return export(source, spec, name, attention, **extra)

        return run

    exports = {
        PREFILL_FILE: exporting("prefill graph", export_prefill, prefill_scope=prefill_scope, hidden=hidden),
        DECODE_FILE: exporting("decode graph", export_decode),
    }
    if speculative_k:
        graph = f"verify graph (speculative decoding, up to {speculative_k} draft tokens)"
        exports[VERIFY_FILE] = exporting(graph, export_verify, hidden=hidden)
    if files is not None:
        exports = {file: export for file, export in exports.items() if file in files}
    outputs = {PREFILL_FILE: ["hidden"], VERIFY_FILE: ["hidden"]} if hidden else None
    return cached_export(cache_dir, model, spec, attention, exports, say, shard, extra_outputs=outputs)


def pass_graphs(
    graphs: dict[str, Any],
    spec: DecoderSpec,
    backend: GenerativeBackend,
    graph_passes: Callable[[], list[Any]] | None,
    say: Progress,
    where: str = "",
    dump_ir: Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Run the graph passes on each of ``graphs`` in place, between the target's own rewrites (onnxruntime: MatMul
    packing before the passes, contrib ops after them): the passes' manifest entries (each naming its graph,
    under ``where`` for a shard) and what the rewrites fused, by rewrite."""
    prepare, rewrite = backend.prepare_graphs, backend.rewrite_graphs
    rewrites: dict[str, dict[str, int]] = dict(prepare(graphs, spec) or {}) if prepare is not None else {}
    entries: list[dict[str, Any]] = []
    for file_name, graph in graphs.items():
        graph_name = f"{where}{file_name.removesuffix('.onnx')}"
        if graph_passes:
            passes = [p.for_graph(GRAPH_ROLES[file_name]) for p in graph_passes()]
            say(f"running passes on the {graph_name} graph: {', '.join(p.name for p in passes)}")
            records = run_passes(graph, passes, dump_ir / graph_name if dump_ir is not None else None)
            entries += [{**pass_entry(r), "graph": graph_name} for r in records]
    for name, counts in ((rewrite(graphs, spec) or {}) if rewrite is not None else {}).items():
        rewrites[name] = {**rewrites.get(name, {}), **counts}
    return entries, rewrites
