"""The text-generation build: a causal LM -> prefill + decode graphs over one weight file -> a target.

``source`` loads the causal LM, ``graphs`` wraps it as the two graphs, ``export`` writes them,
``validation`` compares greedy generation token for token with transformers, ``benchmark``
measures TTFT / inter-token latency / tokens per second, ``build`` is the straight line.
"""
