"""Generative runtimes: the target-independent decoding loop; each target's step engine is in its own folder.

Which target builds text-generation artifacts, and through which module, is the target registry's
(``Target.generative_module``); ``generative_backend`` stays importable from here.
"""

from __future__ import annotations

from aotforge.targets import generative_backend

__all__ = ["generative_backend"]
