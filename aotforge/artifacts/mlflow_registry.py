"""MLflow Model Registry behind the ``Registry`` protocol: artifacts are run artifacts, versions carry tags.

A push logs the artifact directory under a run of the ``aotforge`` experiment and registers a model version
whose tags name the target, toolchain, digest, validation and p50/p99. The digest tag makes pushes idempotent:
the same digest returns its existing version, so re-running a push that failed half-way is safe (at worst an
unregistered run is left behind, never a version without its files).
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
from aotforge.artifacts.manifest import read_manifest
from aotforge.artifacts.names import check_alias, check_name
from aotforge.core.errors import RegistryError

T = TypeVar("T")
EXPERIMENT = "aotforge"
SUBDIR = "artifact"


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
        src = Path(artifact_dir)
        manifest = read_manifest(src)
        require_intact(src, manifest)
        digest = artifact_digest(src)
        existing = [e for e in self._entries(manifest.name) if e.digest == digest]
        if existing:
            return existing[0].name, existing[0].version
        self._call("create model", lambda: self._ensure_model(manifest.name))
        run_id = self._call("log artifacts", lambda: self._log(src))
        bench, validation = manifest.benchmark or {}, manifest.validation or {}
        tags = {
            "digest": digest,
            "target": str(manifest.target.name),
            "toolchain": json.dumps(getattr(manifest, "toolchain", {}), sort_keys=True),
            "validation_passed": str(validation.get("passed")),
            "validation_metrics": json.dumps(validation.get("metrics", {}), sort_keys=True),
            "p50_ms": str(bench.get("p50_ms")),
            "p99_ms": str(bench.get("p99_ms")),
            "artifact_version": str(manifest.version),
        }
        mv = self._call(
            "register version",
            lambda: self.client.create_model_version(
                manifest.name, source=f"runs:/{run_id}/{SUBDIR}", run_id=run_id, tags=tags
            ),
        )
        return manifest.name, int(mv.version)

    def pull(self, ref: str, dest: str | Path) -> Path:
        entry = self.resolve(ref)
        dest = Path(dest)
        if dest.exists():
            raise RegistryError(f"{dest} already exists: pull into a new directory")
        mv = self._call("get version", lambda: self.client.get_model_version(entry.name, str(entry.version)))
        with tempfile.TemporaryDirectory(
            prefix="aotforge-pull-", dir=dest.parent if dest.parent.exists() else None
        ) as t:
            got = self._call("download", lambda: Path(self.client.download_artifacts(str(mv.run_id), SUBDIR, t)))
            require_intact(got, read_manifest(got))  # every file's sha256, before anyone loads it
            if artifact_digest(got) != entry.digest:
                raise RegistryError(f"{entry.ref}: the downloaded manifest does not match digest {entry.digest[:12]}…")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(got), dest)
        return dest

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

    def _log(self, src: Path) -> str:
        exp = self.client.get_experiment_by_name(EXPERIMENT)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(EXPERIMENT)
        run = self.client.create_run(exp_id)
        self.client.log_artifacts(run.info.run_id, str(src), SUBDIR)
        self.client.set_terminated(run.info.run_id)
        return str(run.info.run_id)

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
