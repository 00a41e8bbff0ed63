"""The ``linguafusion`` command (``lingua_fusion.cli:main``): ``app.py`` holds the Typer apps and ``main``; each
module beside it registers its commands: ``serve``, ``translate`` (also stream, listen, models), ``keys``, ``lab``
(bench, chaos, eval), ``vocab``; ``output`` is what every command prints, ``stream`` / ``listen`` the clients
behind ``stream`` and ``listen``."""

# each registers its commands on app, in the order --help lists them
from . import serve, translate  # noqa: F401

# isort: split
from . import keys, lab, state  # noqa: F401
from .app import app, is_loopback, main

__all__ = ["app", "is_loopback", "main"]
