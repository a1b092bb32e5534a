"""MLflow Model Registry behind the ``Registry`` protocol, as MLflow users expect it.

A push of artifact NAME v3 for onnxruntime:

- logs a run named ``NAME-v3-onnxruntime`` in the ``aotforge`` experiment with params (target, passes,
  options, toolchain) and numeric metrics (latency, throughput, memory, per-output validation, size),
  see ``artifacts.mlflow_record``;
- logs the artifact as an MLflow logged model (``model_type`` ``aotforge``) with a ``pyfunc`` flavor
  that loads it through aotforge (``artifacts.mlflow_flavor``): ``mlflow.pyfunc.load_model(
  "models:/NAME-onnxruntime@prod").predict(inputs)`` runs it;
- registers it as a version of the registered model ``NAME-onnxruntime`` (one per model and target),
  tagged with the digest, target, the local ``artifact_version`` and the run; the run is tagged with
  the registered version back.

The digest tag makes pushes idempotent: the same digest returns its existing version, so re-running a
push that failed half-way is safe (at worst an unregistered run is left behind, never a version
without its files). ``promote`` reads the version's run metrics, never the files.
"""

from __future__ import annotations

import builtins
import json
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from aotforge.artifacts.hashing import require_intact
from aotforge.artifacts.local_registry import RegistryEntry, artifact_digest, parse_ref
from aotforge.artifacts.manifest import Manifest, read_manifest
from aotforge.artifacts.mlflow_record import figures_from_metrics, registered_name, run_metrics, run_name, run_params
from aotforge.artifacts.names import check_alias, check_name
from aotforge.core.errors import RegistryError

T = TypeVar("T")
EXPERIMENT = "aotforge"
#: Where versions pushed before the pyfunc layout keep the artifact in their run.
SUBDIR = "artifact"
#: The artifact inside the MLflow model directory (``data_path`` lands under ``data/``).
MODEL_DATA = "data"
LAYOUT_TAG = "aotforge_layout"


class MlflowRegistry:
    """An MLflow tracking server's model registry; ``attempts``/``backoff_s`` bound the retries."""

    def __init__(self, uri: str, *, attempts: int = 4, backoff_s: float = 0.25, timeout_s: float = 2.0) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri.rstrip("/")
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` once the server answers /health, retrying with doubling backoff; then one clear error."""
        from mlflow.exceptions import MlflowException

        last: BaseException | None = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                # A quick health probe first: MLflow's own HTTP retries would take minutes on a dead server.
                with urllib.request.urlopen(f"{self.uri}/health", timeout=self.timeout_s):
                    pass
                return fn()
            except MlflowException as e:
                if getattr(e, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise RegistryError(f"{self.uri}: {what} failed: {str(e).splitlines()[0]}") from e
                last = e
            except OSError as e:
                last = e
        raise RegistryError(
            f"MLflow registry {self.uri} unreachable or failing during {what} after {self.attempts} attempts "
            f"({str(last).splitlines()[0] if last else '?'}): start it (`mlflow server --host 127.0.0.1 ...`) "
            "or fix --registry, then re-run (pushes are idempotent)"
        ) from last

    # --- protocol -------------------------------------------------------------------------------

    def push(self, artifact_dir: str | Path) -> tuple[str, int]:
        """Log the run and the model, register the version; returns (registered name, MLflow version)."""
        src = Path(artifact_dir)
        manifest = read_manifest(src)
        require_intact(src, manifest)
        digest = artifact_digest(src)
        name = registered_name(manifest)
        existing = [e for e in self._entries(name) if e.digest == digest]
        if existing:
            return existing[0].name, existing[0].version
        self._call("create model", lambda: self._ensure_model(name))
        run_id, model_id = self._call("log run and model", lambda: self._log(src, manifest))
        bench, validation = manifest.benchmark or {}, manifest.validation or {}
        tags = {
            "digest": digest,
            "target": str(manifest.target.name),
            "toolchain": json.dumps(getattr(manifest, "toolchain", {}), sort_keys=True),
            "validation_passed": str(validation.get("passed")),
            "validation_metrics": json.dumps(validation.get("metrics", {}), sort_keys=True),
            "p50_ms": str(bench.get("p50_ms")),
            "p99_ms": str(bench.get("p99_ms")),
            "artifact_name": manifest.name,
            "artifact_version": str(manifest.version),
            LAYOUT_TAG: "pyfunc",
        }
        mv = self._call(
            "register version",
            lambda: self.client.create_model_version(
                name, source=f"models:/{model_id}", run_id=run_id, tags=tags, model_id=model_id
            ),
        )
        # The local version is on the MLflow version (tag artifact_version); the MLflow version on the run.
        self._call("tag run", lambda: self.client.set_tag(run_id, "registered_version", f"{name}:{mv.version}"))
        return name, int(mv.version)

    def pull(self, ref: str, dest: str | Path) -> Path:
        entry = self.resolve(ref)
        dest = Path(dest)
        if dest.exists():
            raise RegistryError(f"{dest} already exists: pull into a new directory")
        mv = self._call("get version", lambda: self.client.get_model_version(entry.name, str(entry.version)))
        with tempfile.TemporaryDirectory(
            prefix="aotforge-pull-", dir=dest.parent if dest.parent.exists() else None
        ) as t:
            got = self._call("download", lambda: self._download(mv, Path(t)))
            require_intact(got, read_manifest(got))  # every file's sha256, before anyone loads it
            if artifact_digest(got) != entry.digest:
                raise RegistryError(f"{entry.ref}: the downloaded manifest does not match digest {entry.digest[:12]}…")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(got), dest)
        return dest

    def figures(self, entry: RegistryEntry) -> tuple[dict[str, Any], dict[str, Any]]:
        """The version's (validation, benchmark) figures from its run's metrics: nothing is downloaded."""
        mv = self._call("get version", lambda: self.client.get_model_version(entry.name, str(entry.version)))
        if mv.run_id and mv.tags.get(LAYOUT_TAG):
            metrics = self._call("read run metrics", lambda: self.client.get_run(str(mv.run_id)).data.metrics)
            return figures_from_metrics(dict(metrics))
        # Pushed before runs carried metrics: the version's tags hold the same figures.
        bench = {k: float(mv.tags[k]) for k in ("p50_ms", "p99_ms") if mv.tags.get(k) not in (None, "None")}
        passed = mv.tags.get("validation_passed") == "True"
        return {"passed": passed, "metrics": json.loads(mv.tags.get("validation_metrics") or "{}")}, bench

    def list(self) -> builtins.list[RegistryEntry]:
        models = self._call("list models", lambda: self.client.search_registered_models())
        return [e for m in sorted(models, key=lambda m: m.name) for e in self._entries(m.name)]

    def resolve(self, ref: str) -> RegistryEntry:
        name, version, alias = parse_ref(ref)
        entries = self._entries(name)
        for e in entries:
            if (alias is not None and alias in e.aliases) or e.version == version:
                return e
        what = f"alias {alias!r}" if alias else f"version {version}"
        if not entries:
            models = self._call("list models", lambda: self.client.search_registered_models())
            similar = sorted(m.name for m in models if m.name.startswith(f"{name}-"))
            if similar:
                raise RegistryError(
                    f"{self.uri}: no registered model {name!r}; there is one per model and target (NAME-TARGET): "
                    f"{', '.join(similar)}, e.g. {similar[0]}{'@' + alias if alias else f':{version}'}"
                )
        raise RegistryError(
            f"{self.uri}: {name} has no {what}; it has: {', '.join(e.ref for e in entries) or 'nothing'}"
        )

    def set_alias(self, name: str, alias: str, version: int) -> None:
        check_name(name)
        check_alias(alias)
        self.resolve(f"{name}:{version}")
        self._call("set alias", lambda: self.client.set_registered_model_alias(name, alias, str(version)))

    # --- helpers --------------------------------------------------------------------------------

    def _ensure_model(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

    def _log(self, src: Path, manifest: Manifest) -> tuple[str, str]:
        """The run (named after the build, with params and metrics) and the logged pyfunc model in it."""
        from mlflow.entities import Metric, Param

        from aotforge.artifacts.mlflow_model import save_pyfunc

        exp = self.client.get_experiment_by_name(EXPERIMENT)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(EXPERIMENT)
        run = self.client.create_run(exp_id, run_name=run_name(manifest), tags={"aotforge.name": manifest.name})
        run_id = str(run.info.run_id)
        now = int(time.time() * 1000)
        params = run_params(manifest)
        metrics = run_metrics(manifest, src)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, 0) for k, v in sorted(metrics.items())],
            params=[Param(k, v) for k, v in sorted(params.items())],
        )
        model = self.client.create_logged_model(
            exp_id, name=registered_name(manifest), source_run_id=run_id, model_type="aotforge",
            params={k: params[k] for k in ("target", "passes", "artifact_version")},
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="aotforge-mlflow-") as t:
            self.client.log_model_artifacts(model.model_id, str(save_pyfunc(src, Path(t) / "model", manifest)))
        self.client.finalize_logged_model(model.model_id, "READY")
        self.client.set_terminated(run_id)
        return run_id, str(model.model_id)

    def _download(self, mv: Any, into: Path) -> Path:
        """The artifact directory of a version: inside its MLflow model, or (older pushes) its run's."""
        if mv.tags.get(LAYOUT_TAG) == "pyfunc":
            from mlflow.artifacts import download_artifacts

            # The model's own artifact location: a models:/ URI would be resolved against the default registry.
            uri = self.client.get_model_version_download_uri(mv.name, str(mv.version))
            model = Path(download_artifacts(artifact_uri=uri, dst_path=str(into), tracking_uri=self.uri))
            (artifact,) = [p for p in (model / MODEL_DATA).iterdir() if p.is_dir()]
            return artifact
        return Path(self.client.download_artifacts(str(mv.run_id), SUBDIR, str(into)))

    def _entries(self, name: str) -> builtins.list[RegistryEntry]:
        check_name(name)  # it goes into a filter string: never a quote

        def fetch() -> tuple[Any, builtins.list[Any]]:
            models = self.client.search_registered_models(filter_string=f"name = '{name}'")
            versions = self.client.search_model_versions(f"name = '{name}'") if models else []
            return (models[0] if models else None), versions

        model, versions = self._call("search versions", fetch)
        aliases: dict[int, builtins.list[str]] = {}
        for alias, v in (getattr(model, "aliases", None) or {}).items():
            aliases.setdefault(int(v), []).append(alias)
        return sorted(
            (
                RegistryEntry(
                    name=name,
                    version=int(v.version),
                    digest=v.tags.get("digest", ""),
                    blob_sha256="",
                    target=v.tags.get("target", "?"),
                    artifact_version=int(v.tags.get("artifact_version", "0") or 0),
                    pushed_at=float(v.creation_timestamp or 0) / 1000,
                    aliases=tuple(sorted(aliases.get(int(v.version), []))),
                )
                for v in versions
            ),
            key=lambda e: e.version,
        )
