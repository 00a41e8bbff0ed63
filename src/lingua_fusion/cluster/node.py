"""Which Ray node a replica runs on, and its own state directory there.

With ``state.redis_url`` set, nothing a user creates lives in the state directory (keys, glossaries, vocabularies,
rooms, tickets, quotas and the stream log are in Redis); what is left there is a replica's own (its PID file, a
model cache). The driver's ``--state-dir`` names a path that every host has, and each replica keeps its files in
``<state-dir>/nodes/<node id>``: two nodes never share a file, on separate hosts or on one (the loopback cluster of
the tests), and nothing a second node needs is on the first one's disk.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Settings

NODE_ID_CHARS = 12  # of Ray's 56 hex digits: enough to tell a cluster's nodes apart in a path or a beat


def ray_node_id() -> str:
    """This process's Ray node (its first ``NODE_ID_CHARS`` hex digits); "" outside a Ray worker."""
    try:
        import ray
    except ImportError:
        return ""
    if not ray.is_initialized():
        return ""
    return str(ray.get_runtime_context().get_node_id())[:NODE_ID_CHARS]


def node_state_dir(base: Path, node: str) -> Path:
    """The state directory of a replica on ``node`` under the driver's ``base`` (``base`` itself off Ray)."""
    return base / "nodes" / node if node else base


def place_on_node(settings: Settings) -> str:
    """Point ``settings`` at this node's own state directory (created); return the node id."""
    node = ray_node_id()
    path = node_state_dir(settings.resolved_state_dir(), node)
    path.mkdir(parents=True, exist_ok=True)
    settings.state_dir = path
    return node
