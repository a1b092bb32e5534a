"""Rules of the legalize step (``importable/legalize.py``), one module per family of ops.

A rule takes one main-graph node (with the graph's constants and inferred static shapes at hand,
:class:`~aotforge.targets.tvm.importable.rules.base.Graph`) and returns the nodes that replace it,
or None to leave it alone.
"""
