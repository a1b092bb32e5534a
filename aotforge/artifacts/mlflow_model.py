"""Writing an aotforge artifact as an MLflow model directory whose pyfunc flavor loads it through aotforge.

The loading side is ``artifacts.mlflow_flavor`` (named here only as a string, so this module does not
import the loader and the registry does not import it either).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.manifest import Manifest
from aotforge.targets import get_target

#: The pyfunc ``loader_module``: its ``_load_pyfunc(data_path)`` returns the model MLflow wraps.
LOADER_MODULE = "aotforge.artifacts.mlflow_flavor"


def save_pyfunc(artifact_dir: Path, dest: Path, manifest: Manifest) -> Path:
    """Write an MLflow model directory at ``dest`` holding the artifact (``data/<target>/``) and its MLmodel."""
    import mlflow.pyfunc

    with warnings.catch_warnings():
        # "An input example was not provided": by design; the signature comes from the manifest's IO.
        warnings.simplefilter("ignore", UserWarning)
        _save(mlflow.pyfunc, dest, artifact_dir, manifest)
    return dest


def _save(pyfunc: Any, dest: Path, artifact_dir: Path, manifest: Manifest) -> None:
    pyfunc.save_model(
        str(dest),
        loader_module=LOADER_MODULE,
        data_path=str(artifact_dir),
        pip_requirements=_requirements(manifest),
        signature=_signature(manifest),
        metadata={"aotforge": {"name": manifest.name, "version": manifest.version, "target": manifest.target.name}},
    )


def _requirements(manifest: Manifest) -> list[str]:
    """aotforge and the target's runtime, at the versions the artifact was built with."""
    pins = [f"aotforge=={manifest.toolchain['aotforge']}"] if manifest.toolchain.get("aotforge") else ["aotforge"]
    for package in get_target(manifest.target.name).runtime_packages:
        version = manifest.toolchain.get(package.removeprefix("apache-"))
        pins.append(f"{package}=={version}" if version else package)
    return pins


def _signature(manifest: Manifest) -> Any:
    """A tensor signature from the manifest's IO (dynamic dims as -1); None for dtypes MLflow lacks (bf16 ...)."""
    from mlflow.exceptions import MlflowException
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def schema(tensors: list[dict[str, Any]]) -> Any:
        return Schema(
            [
                TensorSpec(np.dtype(t["dtype"]), tuple(d if isinstance(d, int) else -1 for d in t["shape"]), t["name"])
                for t in tensors
            ]
        )

    try:
        return ModelSignature(inputs=schema(manifest.io["inputs"]), outputs=schema(manifest.io["outputs"]))
    except (MlflowException, TypeError, ValueError):
        return None
