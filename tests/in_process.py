"""Whether the test helpers' builds (``quick_build``, ``build_text_generation``) use the isolated backend worker.

They do not: the backend runs in the test's process. A worker's start is an interpreter and the backend's imports,
several times the CPU of a tiny model's compile, and on 2 cores that CPU is the default run's time;
what a build checks (import, passes, compile, numerics against the source) is the same either way. The worker
itself (deadlines, memory limit, a crash, a kill, its progress lines) is what the CLI tests,
tests/test_isolation.py, tests/test_farm.py and tests/test_fault_injection.py build through.
"""

ISOLATE_BACKEND = False
