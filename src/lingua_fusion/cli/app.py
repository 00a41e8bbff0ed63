"""The ``linguafusion`` command's Typer apps, the options its commands share, and ``main`` (the documented exit
codes and error form). The commands register themselves on ``app`` from the modules beside this one."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer
from typer.core import TyperOption

from ..errors import LinguaFusionError
from .output import fail, usage
from .vocab import vocab_app

if TYPE_CHECKING:
    from typer._click import Context  # the click that typer bundles (TyperOption's methods take its Context)

    from ..config import Settings

T = TypeVar("T")

app = typer.Typer(help="LinguaFusion: real-time multimodal translation server, SDK and CLI.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
keys_app = typer.Typer(help="Manage API keys in the server's state directory.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
bench_app = typer.Typer(help="Benchmarks: file latency, live load against a server, comparison of reports.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")
chaos_app = typer.Typer(help="Chaos experiments: faults on a schedule under load, against a baseline.",
                        no_args_is_help=True)
app.add_typer(chaos_app, name="chaos")
app.add_typer(vocab_app, name="vocab")  # cli/vocab.py: taught signs and lip words
_type_label = TyperOption.display_type_rich


def _no_bool_label(self: TyperOption, ctx: Context) -> str | None:
    """--help shows no "<bool>" after a flag: a flag takes no value."""
    return None if self.is_flag else _type_label(self, ctx)


TyperOption.display_type_rich = _no_bool_label  # type: ignore[method-assign]

URL_OPT = typer.Option(None, "--url", envvar="LINGUAFUSION_URL", help="Server URL; without it, run in-process.")
KEY_OPT = typer.Option(None, "--api-key", envvar="LINGUAFUSION_API_KEY", help="API key (sk_...).")
STATE_OPT = typer.Option(None, "--state-dir", envvar="LINGUAFUSION_STATE_DIR", help="Where keys and state live.")


def _fail(exc: LinguaFusionError) -> None:
    fail(exc)


def is_loopback(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def _settings(state_dir: Path | None) -> Settings:
    from ..config import Settings

    s = Settings()
    if state_dir is not None:
        s.state_dir = state_dir
    return s



def main() -> None:
    from typer.exceptions import TyperException  # typer's usage errors (its own click's ClickException) are these

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        code = app(standalone_mode=False)  # usage errors come back here, to be told in the documented form
    except TyperException as exc:  # an unknown option or command, a value out of range, a missing argument
        code = _exit_code(usage, exc.format_message())
    except LinguaFusionError as exc:  # a typed error that a command did not catch: still the documented form
        code = _exit_code(fail, exc)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


def _exit_code(report: Callable[[T], NoReturn], what: T) -> int:
    try:
        report(what)
    except typer.Exit as done:
        return int(done.exit_code)
    return 2


if __name__ == "__main__":
    main()
