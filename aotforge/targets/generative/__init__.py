"""Generative runtimes: the target-independent decoding loop and one step engine per target."""
