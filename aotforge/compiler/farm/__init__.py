"""Build farms: one model for several targets, and plans of models x targets on local workers or a Ray cluster.

``prepare`` runs the frontend and the target-independent passes once and writes one build bundle per
target (``compiler.bundle``); ``worker`` finishes a bundle in a fresh interpreter (or a Ray task);
``report`` compares the artifacts (``matrix.json`` / ``.md`` / ``.png``); ``multi`` is
``compile --target a,b``; ``plan`` and ``matrix`` are ``aotforge matrix PLAN.toml``; ``executors``
runs jobs in local worker processes, ``ray_executor`` as Ray tasks.
"""
