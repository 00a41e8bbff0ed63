"""Deploy LinguaFusion on Ray Serve: two Serve applications on one Ray cluster.

- ``lf-models`` (no route): the ``ModelReplica`` deployment, ``model_replicas`` replicas of 1 CPU each, or
  autoscaled between ``model_replicas`` and ``max_model_replicas`` by ``autoscale.slo_policy`` (queue depth and
  SLO headroom, reported by each replica).
- ``lf-gateway`` (route ``/``): the ``Gateway`` ingress deployment, ``gateways`` replicas of 0 CPUs (their work is
  I/O and sessions; VAD is light), behind Serve's HTTP proxy on ``host:port``, spread evenly over the cluster's
  nodes (at most ceil(gateways / nodes) on one: a host lost takes only its share of the gateways, and each node's
  gateways keep their files in that node's own state directory).

``run_cluster`` is what ``linguafusion serve --cluster`` runs: connect to a Ray cluster (``address``; none starts
a local one owned by this process), deploy both, wait for SIGINT / SIGTERM, have every gateway drain its streams
(heartbeat.py's drain signal in Redis), then shut Serve down.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from ..config import Settings
from .gateway import MODEL_DEPLOYMENT, MODELS_APP, Gateway
from .heartbeat import cluster_name, request_drain, wait_drained
from .replica import ModelReplica

if TYPE_CHECKING:
    from ray.serve import Application

log = logging.getLogger("lingua_fusion.cluster")
GATEWAY_APP = "lf-gateway"
NAMESPACE = "linguafusion"
MAX_ONGOING_MODEL_CALLS = 1024  # calls a model replica takes at once: all of them meet in its scheduler
DRAIN_GRACE_S = 3.0  # beyond server.drain_timeout_s: a beat to see the signal and one to report done
MAX_ONGOING_GATEWAY = 512  # HTTP requests and WebSockets a gateway replica holds at once (= server.max_connections)


@dataclass(frozen=True)
class ClusterSpec:
    gateways: int = 2
    model_replicas: int = 1
    max_model_replicas: int | None = None  # set: autoscale the model replicas between the two
    model_cpus: float = 1.0


def model_app(settings: Settings, spec: ClusterSpec) -> Application:
    from ray import serve
    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy

    deployment = functools.partial(serve.deployment, name=MODEL_DEPLOYMENT,
                                   max_ongoing_requests=MAX_ONGOING_MODEL_CALLS,
                                   ray_actor_options={"num_cpus": spec.model_cpus},
                                   health_check_period_s=2.0, health_check_timeout_s=10.0)
    if spec.max_model_replicas and spec.max_model_replicas > spec.model_replicas:
        make = deployment(autoscaling_config=AutoscalingConfig(
            min_replicas=spec.model_replicas, max_replicas=spec.max_model_replicas,
            initial_replicas=spec.model_replicas, upscale_delay_s=10.0, downscale_delay_s=120.0,
            look_back_period_s=10.0, metrics_interval_s=2.0,  # Ray 2.60 warns (later refuses) unless look-back > it
            policy=AutoscalingPolicy(policy_function="lingua_fusion.cluster.autoscale:slo_policy")))
    else:
        make = deployment(num_replicas=spec.model_replicas)
    return make(ModelReplica).bind(settings.model_dump(mode="json"))


def gateways_per_node(gateways: int, nodes: int) -> int:
    """The most gateway replicas one node may hold so that they spread evenly over ``nodes`` live nodes."""
    return -(-gateways // max(1, nodes))


def gateway_app(settings: Settings, spec: ClusterSpec, nodes: int = 1) -> Application:
    from ray import serve

    ingress = serve.ingress()(Gateway)
    return serve.deployment(name="Gateway", num_replicas=spec.gateways, max_ongoing_requests=MAX_ONGOING_GATEWAY,
                            ray_actor_options={"num_cpus": 0},
                            max_replicas_per_node=gateways_per_node(spec.gateways, nodes),
                            graceful_shutdown_timeout_s=settings.server.drain_timeout_s,
                            health_check_period_s=2.0)(ingress).bind(settings.model_dump(mode="json"), MODELS_APP)


def connect(address: str | None, local_cpus: int | None = None) -> None:
    """Join the Ray cluster at ``address``, or start a local one owned by this process."""
    import ray

    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    else:
        ray.init(namespace=NAMESPACE, num_cpus=local_cpus, include_dashboard=False, log_to_driver=False,
                 object_store_memory=200 * 1024 * 1024)


def deploy(settings: Settings, spec: ClusterSpec, *, host: str, port: int) -> None:
    """Start Serve's proxy on host:port, deploy the models, then the gateways (connected to Ray already), spread
    over the nodes alive now."""
    import ray
    from ray import serve

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    serve.start(http_options={"host": host, "port": port})
    serve.run(model_app(settings, spec), name=MODELS_APP, route_prefix=None, blocking=False)
    serve.run(gateway_app(settings, spec, nodes), name=GATEWAY_APP, route_prefix="/", blocking=False)


def shutdown() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def run_cluster(settings: Settings, spec: ClusterSpec, *, address: str | None, host: str, port: int,
                ready: Callable[[], object] | None = None) -> None:
    """Deploy, call ``ready()``, then block until SIGINT / SIGTERM; then drain every gateway's streams (as a
    single server does on SIGTERM) and shut Serve down."""
    redis_url, cluster = settings.state.redis_url or "", cluster_name(host, port)
    request_drain(redis_url, cluster, on=False)  # a drain signal left by an earlier run of this cluster
    stop = threading.Event()
    connect(address)
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs handlers of its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        deploy(settings, spec, host=host, port=port)  # a signal meanwhile is acted on once it is done
        if ready is not None and not stop.is_set():
            ready()
        while not stop.wait(1.0):
            pass
        request_drain(redis_url, cluster)
        if not wait_drained(redis_url, cluster, settings.server.drain_timeout_s + DRAIN_GRACE_S):
            log.warning("gateways did not all drain in time; shutting down anyway")
    finally:
        shutdown()
        with contextlib.suppress(Exception):
            request_drain(redis_url, cluster, on=False)


class ClusterArgs(TypedDict, total=False):
    """A Serve config file's ``args`` for ``build_models``/``build_gateway``: ``ClusterSpec``'s fields (others are
    ignored)."""
    gateways: int
    model_replicas: int
    max_model_replicas: int | None
    model_cpus: float


def _spec(args: ClusterArgs) -> ClusterSpec:
    d = ClusterSpec()
    return ClusterSpec(gateways=args.get("gateways", d.gateways),
                       model_replicas=args.get("model_replicas", d.model_replicas),
                       max_model_replicas=args.get("max_model_replicas", d.max_model_replicas),
                       model_cpus=args.get("model_cpus", d.model_cpus))


def build_models(args: ClusterArgs) -> Application:
    """The ``lf-models`` application for a Serve config file (KubeRay's ``serveConfigV2``, ``serve deploy``):
    ``import_path: lingua_fusion.cluster.deploy:build_models``; ``args`` as ``ClusterSpec``'s fields; settings from
    the environment (``LINGUAFUSION_*``), as ``linguafusion serve`` reads them."""
    return model_app(Settings(), _spec(args))


def build_gateway(args: ClusterArgs) -> Application:
    """The ``lf-gateway`` application for a Serve config file (route ``/``); needs ``state.redis_url``."""
    settings = Settings()
    if not settings.state.redis_url:
        raise ValueError("the gateway needs LINGUAFUSION_STATE__REDIS_URL: the stream log and keys are shared")
    return gateway_app(settings, _spec(args))
