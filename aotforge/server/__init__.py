"""``aotforge serve``: the OpenAI-compatible HTTP server over the runtime's engine, its Prometheus metrics, and
the load generator of ``aotforge bench serve``. The top layer beside the CLI: nothing below imports it."""
