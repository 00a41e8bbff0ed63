"""``linguafusion serve``: one process, ``--workers`` model processes, or a Ray Serve cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import STATE_OPT, _settings, app, is_loopback
from .output import err, usage

if TYPE_CHECKING:
    from ..config import Settings
    from ..state.users import UserStore


@app.command()
def serve(host: str = typer.Option("127.0.0.1", "--host"), port: int = typer.Option(8000, "--port"),
          no_auth: bool = typer.Option(False, "--no-auth", help="Development only: no API keys (loopback only)."),
          state_dir: Path | None = STATE_OPT, log_level: str = typer.Option("info", "--log-level"),
          chaos: bool = typer.Option(False, "--chaos", help="Allow fault injection (admin key) for experiments."),
          workers: int = typer.Option(1, "--workers", min=1, max=64,
                                      help="Stream worker processes sharing one model process (api/workers.py); "
                                           "1: everything in this process."),
          model_processes: int = typer.Option(1, "--model-processes", min=1, max=64,
                                              help="With --workers: model processes (each its own engine and share "
                                                   "of the GPU; worker i feeds model process i % M)."),
          cluster: bool = typer.Option(False, "--cluster", help="Run on Ray Serve: gateway and model replicas, "
                                                                 "state in Redis (docs/cluster.md)."),
          ray_address: str | None = typer.Option(None, "--ray-address", envvar="RAY_ADDRESS",
                                                 help="With --cluster: the Ray cluster (host:port); none starts "
                                                      "a local one."),
          gateways: int = typer.Option(2, "--gateways", min=1, max=64, help="With --cluster: gateway replicas."),
          model_replicas: int = typer.Option(1, "--model-replicas", min=1, max=64,
                                             help="With --cluster: model replicas (the minimum when autoscaling)."),
          max_model_replicas: int = typer.Option(0, "--max-model-replicas", min=0, max=256,
                                                 help="With --cluster: autoscale model replicas up to this many "
                                                      "(queue depth and SLO headroom); 0: a fixed count.")
          ) -> None:
    """Run the server (SQLite state, in-process cache, CPU models)."""
    from ..api import create_app
    from ..api.server import build_server, install_logging

    if no_auth and not is_loopback(host):
        usage(f"--no-auth may only bind to loopback, not {host}")
    settings = _settings(state_dir)
    settings.server.host, settings.server.port, settings.server.auth = host, port, not no_auth
    settings.server.chaos = chaos or settings.server.chaos
    install_logging(log_level)  # before the app is built: what it logs at start-up is masked too
    if cluster:
        from ..cluster.deploy import ClusterSpec, run_cluster

        if workers > 1 or model_processes > 1 or settings.server.chaos:
            usage("--cluster runs its own processes: it takes neither --workers, --model-processes nor --chaos")
        if not settings.state.redis_url:
            usage("--cluster needs Redis for the shared stream log: set LINGUAFUSION_STATE__REDIS_URL")

        def ready() -> None:
            _banner(None, settings, host, port)  # gateways read the same key store (Redis: state/users.py)

        spec = ClusterSpec(gateways, model_replicas, max_model_replicas or None)
        run_cluster(settings, spec, address=ray_address, host=host, port=port, ready=ready)
        return
    if model_processes > workers:
        usage(f"--model-processes {model_processes} needs at least as many --workers (each feeds one)")
    if workers > 1:
        if settings.server.chaos:
            usage("--chaos needs a single process: fault injection is not sent to the model process (--workers 1)")
        from ..api.workers import serve_sharded

        _banner(None, settings, host, port)
        try:
            serve_sharded(settings, workers, log_level, model_processes)
        except OSError as exc:  # the port is taken, the host is not ours
            usage(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        return
    app_ = create_app(settings)
    _banner(app_.state.store, settings, host, port)
    # connection cap, head timeout, WebSocket frame limit, masked logs, drain on SIGTERM (api/server.py)
    build_server(app_, settings, log_level=log_level).run()


def runnable() -> str:
    """How to run this command from the user's shell: ``linguafusion`` when that is on PATH and is this one,
    else its path (``make run`` installs it in .venv/bin, which is not on PATH)."""
    import shutil

    here = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("linguafusion")
    if found and here is not None and Path(found).resolve() == here:
        return "linguafusion"
    beside = Path(sys.executable).parent / "linguafusion"
    return str(beside) if beside.exists() else "linguafusion"


def _banner(store: UserStore | None, settings: Settings, host: str, port: int) -> None:
    """Where the server is, where its state lives, and with auth on and no key yet, the command that makes one.
    ``store``: the server's key store, or None to open the one the settings name (and close it)."""
    from ..errors import LinguaFusionError
    from ..redact import redact_url
    from ..state.stores import open_users

    state = settings.resolved_state_dir()
    auth = settings.server.auth
    redis_url = settings.state.redis_url
    where = f"keys in Redis ({redact_url(redis_url)})" if redis_url else f"state directory: {state}"
    err.print(f"LinguaFusion on http://{host}:{port} (auth {'on' if auth else 'off'}); {where}", markup=False)
    keys = store or open_users(state, redis_url)
    try:
        none_yet = auth and not any(not k.revoked for k in keys.list_keys())
        if redis_url:
            _left_behind(keys, state, redis_url)
    except LinguaFusionError as exc:  # Redis down at start: the server serves once it answers
        err.print(f"the key store does not answer yet: {exc.message}", markup=False, style="yellow")
        none_yet = False
    finally:
        if store is None:
            keys.close()
    if none_yet:
        err.print(f"no API key in {'Redis' if redis_url else state} yet: create one with\n  {runnable()} keys "
                  f"create --admin{'' if redis_url else f' --state-dir {state}'}", markup=False, style="yellow")
    err.print(f"API docs: http://{host}:{port}/docs", markup=False, style="dim")




def _left_behind(shared: UserStore, state: Path, redis_url: str) -> None:
    """With keys in Redis, warn of keys that only the state directory's SQLite holds: the server no longer reads
    them (a server that ran before Redis was set); ``state migrate`` moves them."""
    import sqlite3

    from ..redact import redact_url
    from ..state.sqlite import SQLiteStore

    if not (state / "linguafusion.sqlite3").exists():
        return
    try:
        local = SQLiteStore(state)
        try:
            records = local.records()
        finally:
            local.close()
    except sqlite3.Error as exc:  # locked or corrupt: only a warning's worth, never the start
        err.print(f"the state directory's key store could not be read: {exc}", markup=False, style="yellow")
        return
    there = {r.key.key_id for r in shared.records()}  # one listing, not a round trip per key
    missing = [r for r in records if r.key.key_id not in there]
    if missing:
        err.print(f"{len(missing)} API key(s) in {state} are not in Redis, where this server reads keys: move them "
                  f"with\n  {runnable()} state migrate --to redis {redact_url(redis_url)} --state-dir {state}",
                  markup=False, style="yellow")
