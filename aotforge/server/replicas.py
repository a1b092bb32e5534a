"""``aotforge serve ARTIFACT --replicas R``: R data-parallel replicas of the server behind one endpoint, on Ray Serve.

Each replica is a Ray Serve deployment replica (an actor) that loads the artifact into its own engine and serves
the same FastAPI app as ``aotforge serve`` (``server/app.py``), built in the replica
(``__serve_build_asgi_app__``) because the app holds the engine. Ray Serve's proxy is the one endpoint, and its
router sends each request to the less loaded of two replicas by their queue lengths (power of two choices), as
vLLM's Ray Serve deployments route. A replica whose engine can no longer serve (a tensor-parallel rank died:
``targets/generative/ranks.py``) fails its health check, and Ray Serve replaces it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from aotforge.core.errors import OptionsError
from aotforge.core.placement import Placement
from aotforge.runtime.params import EngineConfig

#: The Ray Serve application's name (``serve status``, ``serve.delete``).
APP_NAME = "aotforge"


@dataclasses.dataclass(frozen=True)
class ReplicaOptions:
    """What each replica serves and how Ray Serve keeps them."""

    replicas: int = 2
    api_key: str | None = None
    served_model_name: str | None = None
    drain_timeout_s: float = 30.0
    #: seconds between Ray Serve's health checks of a replica
    health_check_period_s: float = 5.0


def engine_failure(engine: Any) -> str:
    """Why ``engine`` (an ``AsyncEngine``) cannot serve any more ('' while it can): its runner's ``failure``."""
    runner = getattr(getattr(engine, "engine", None), "runner", None)
    return str(getattr(runner, "failure", "") or "")


def replica_application(
    artifact: Path, config: EngineConfig, options: ReplicaOptions, placement: Placement = Placement()
) -> Any:
    """The Ray Serve application: ``options.replicas`` replicas of the server over ``artifact`` (with
    ``placement`` Ray, each replica's stages are actors of the same cluster)."""
    from ray import serve

    from aotforge.artifacts.engine_loader import load_async_engine
    from aotforge.server.app import build_app

    if options.replicas < 1:
        raise OptionsError(f"--replicas is a number of servers >= 1, got {options.replicas}")
    artifact = Path(artifact).resolve()

    @serve.ingress()
    class Replica:
        def __init__(self) -> None:
            self.engine = load_async_engine(artifact, config, placement)

        def __serve_build_asgi_app__(self) -> Any:
            return build_app(
                self.engine,
                api_key=options.api_key,
                served_model_name=options.served_model_name,
                drain_timeout_s=options.drain_timeout_s,
            )

        def check_health(self) -> None:
            why = engine_failure(self.engine)
            if why:
                raise RuntimeError(why)

    deployment: Any = serve.deployment(
        name=APP_NAME,
        num_replicas=options.replicas,
        # Requests a replica's engine holds (running + waiting); past it Ray Serve's proxy queues them.
        max_ongoing_requests=max(config.max_num_seqs, 1) + config.max_waiting,
        health_check_period_s=options.health_check_period_s,
        graceful_shutdown_timeout_s=options.drain_timeout_s,
    )(Replica)
    return deployment.bind()


def serve_replicas(
    artifact: Path,
    config: EngineConfig,
    options: ReplicaOptions,
    host: str,
    port: int,
    address: str | None,
    placement: Placement = Placement(),
) -> None:
    """Start (or join, with ``address``) a Ray instance, run the replicas on ``host:port`` until interrupted."""
    import ray
    from ray import serve

    ray.init(address=address, include_dashboard=False, log_to_driver=True)
    try:
        # One proxy, on the head: the one endpoint (a proxy per node would each bind host:port).
        serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
        serve.run(
            replica_application(artifact, config, options, placement), name=APP_NAME, route_prefix="/", blocking=True
        )
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
