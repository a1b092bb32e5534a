"""What every aotforge pass is: :mod:`aotforge.core.graph_pass`'s contract (the targets' import steps follow it too,
and targets never import passes), named here where the passes import it from."""

from __future__ import annotations

from aotforge.core.graph_pass import GraphPass, GraphRole, NoParams, count_nodes

__all__ = ["GraphPass", "GraphRole", "NoParams", "count_nodes"]
