"""The ``tensorrt`` backend.

``target`` (plain Python, runs anywhere), ``plan`` (what the builder is told), ``sdk`` (every
TensorRT call, imported only to build or load).
"""
