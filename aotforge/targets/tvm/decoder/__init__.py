"""tvm's text-generation path: prefill, decode and verify functions of one ``lib.so`` over one weight file.

``engine`` (the generative backend: compile and load), ``graphs`` (the exported graphs as tvm imports them),
``buckets`` (which prompt and batch buckets a build compiles), ``weight_only`` (the matmul weights packed at
compile time), ``weight_file`` (the one weight file, read once onto huge pages), ``step_engine`` (its functions over the
weights), ``model_runner`` (the serving runtime's runners).
"""
