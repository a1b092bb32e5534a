"""The MLflow ``pyfunc`` flavor of an aotforge artifact: ``mlflow.pyfunc.load_model(uri).predict(inputs)``.

A push (``artifacts.mlflow_registry``) saves the artifact as an MLflow model whose pyfunc flavor names
this module as its ``loader_module`` and the artifact directory as its ``data`` (under ``data/``): no
pickle and no copied code, so loading it needs aotforge installed (``mlflow models serve`` with an
environment that has aotforge) and runs :func:`aotforge.artifacts.loader.load`, which verifies every
file's sha256 and this host before the runtime loads anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.errors import InputSpecError


class AotforgePyfunc:
    """What ``mlflow.pyfunc`` wraps: ``predict`` maps named arrays (or one array, for a one-input model)
    to named arrays, through the verified artifact."""

    def __init__(self, artifact: Any) -> None:
        self.artifact = artifact

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        names = [t.name for t in self.artifact.io.inputs]
        if hasattr(model_input, "to_dict") and hasattr(model_input, "columns"):  # a pandas DataFrame
            model_input = {c: np.stack(model_input[c].to_numpy()) for c in model_input.columns}
        if not isinstance(model_input, Mapping):
            if len(names) != 1:
                raise InputSpecError(f"this model takes {len(names)} inputs {names}: pass a dict of arrays by name")
            model_input = {names[0]: model_input}
        inputs = {}
        for spec in self.artifact.io.inputs:
            if spec.name not in model_input:
                raise InputSpecError(f"input {spec.name!r} is missing: the model takes {names}")
            inputs[spec.name] = np.asarray(model_input[spec.name]).astype(spec.dtype, copy=False)
        return dict(self.artifact.run(inputs))


def _load_pyfunc(data_path: str) -> AotforgePyfunc:
    """MLflow's entry (``loader_module``): ``data_path`` is the artifact directory inside the model."""
    from aotforge.artifacts.loader import load

    return AotforgePyfunc(load(Path(data_path)))
