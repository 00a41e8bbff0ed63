"""HTTP API: FastAPI app, REST routes, auth, error mapping."""

from .app import create_app

__all__ = ["create_app"]
