"""The ``tvm`` backend: ONNX -> Relax -> a CPU shared library through LLVM.

``target`` (the Target, its options and runner), ``host`` (can this host run a lib.so),
``pipeline`` (the Relax passes, in order), ``rewrites/`` (Relax graph rewrites: bf16, int8 on
VNNI, fast GELU), ``kernels/`` (hand-written tensorized TIR kernels), ``schedules/`` (the default
search-free schedule rules), ``tuning/`` (MetaSchedule search and its record store), ``decoder/``
(text generation: prefill / decode functions of one ``lib.so``, their buckets and weight file).
"""
