"""The terminal during a build: one live line per stage with its elapsed time, a per-stage summary at
the end, and the libraries' own chatter (exporter warnings, TVM / MLflow logging, tqdm bars) hidden
unless ``aotforge --verbose``."""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Loggers of the libraries a build runs, quieted to errors without --verbose.
NOISY_LOGGERS = ("torch", "torch.onnx", "torch.export", "onnxscript", "onnx_ir", "tvm", "mlflow", "alembic",
                 "onnxruntime", "matplotlib", "urllib3", "transformers", "httpx", "huggingface_hub")  # fmt: skip


def quiet_libraries() -> None:
    """Warnings and library logging below ERROR off, tqdm bars off (the CLI's default; --verbose keeps them)."""
    warnings.filterwarnings("ignore")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # torch's exporter logs through handlers of its own (the "W1203 ..." lines): below ERROR, nothing passes.
    logging.disable(logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")


class StageProgress:
    """A ``progress(message)`` callback for ``build()``: each message starts a stage; ``summary()`` lists
    every stage with its duration."""

    def __init__(self, status: Any) -> None:
        self.status = status
        self.stages: list[tuple[str, float]] = []
        self._started = time.perf_counter()
        self._current: tuple[str, float] | None = None

    def __call__(self, message: str) -> None:
        self._close()
        self._current = (message, time.perf_counter())
        self.status.update(f"{message}  [dim](since start {time.perf_counter() - self._started:.1f} s)[/dim]")

    def _close(self) -> None:
        if self._current is not None:
            name, started = self._current
            self.stages.append((name, time.perf_counter() - started))
            self._current = None

    def summary(self) -> Any:
        """A rich table: stage, seconds, share of the build."""
        from rich.table import Table

        self._close()
        total = time.perf_counter() - self._started
        table = Table(title=f"build stages ({total:.1f} s)", title_justify="left", box=None, pad_edge=False)
        table.add_column("stage")
        table.add_column("s", justify="right")
        table.add_column("%", justify="right")
        for name, seconds in self.stages:
            table.add_row(name, f"{seconds:.2f}", f"{100 * seconds / total:.0f}" if total else "")
        return table


@contextmanager
def build_progress(console: Any) -> Iterator[StageProgress]:
    """A live status line updated per stage, its summary printed after a build that succeeds. A failed build
    prints nothing more: its one ``error:`` line is all a user (or a CI log grep) should have to read."""
    with console.status("starting") as status:
        progress = StageProgress(status)
        yield progress
    if progress.stages or progress._current:
        console.print(progress.summary())
