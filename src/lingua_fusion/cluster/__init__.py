"""LinguaFusion on Ray Serve (docs/cluster.md): gateways as stateless Serve ingress replicas, model work on model
replicas behind a deployment handle, state (stream log, rooms, gateways' heartbeats) in Redis.

``wire.py`` (what crosses the hop), ``port.py`` (the gateway's ModelPort), ``replica.py`` (a model replica: our
Executor), ``gateway.py`` (the FastAPI app as an ingress), ``heartbeat.py`` (gateways in Redis, the cluster-wide
stream count), ``autoscale.py`` (the replica count from queue depth and SLO headroom), ``deploy.py`` (the two Serve
applications; ``linguafusion serve --cluster``). Ray is imported only inside functions: the rest of the package
never needs it.
"""
