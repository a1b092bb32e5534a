"""Relax graph rewrites the ``tvm`` pipeline runs before legalization (bf16, int8 on VNNI, fast GELU)."""
