"""``python -m aotforge`` is the ``aotforge`` command."""

from aotforge.compiler.cli import main

main()
