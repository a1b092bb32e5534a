"""Frontends, build options, the build line, validation, benchmark and the CLI (``aotforge.build`` is the API)."""
