"""``linguafusion keys create | list | revoke``: API keys in the server's key store: the state directory's SQLite, or
Redis when ``LINGUAFUSION_STATE__REDIS_URL`` is set (state/users.py), as the server chooses."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..errors import InvalidParameter, LinguaFusionError
from .app import STATE_OPT, _settings, keys_app
from .output import err, fail

if TYPE_CHECKING:
    from ..state.users import UserStore


def _key_store(state_dir: Path | None, *, create: bool) -> UserStore:
    """The key store the server would use (Redis when ``state.redis_url`` is set, else ``--state-dir``'s, or the
    default's), named on stderr; list/revoke never create a SQLite one."""
    from ..state.sqlite import SQLiteStore

    settings = _settings(state_dir)
    if settings.state.redis_url:
        from ..redact import redact_url
        from ..state.redis_users import RedisUserStore

        err.print(f"key store: Redis at {redact_url(settings.state.redis_url)} (LINGUAFUSION_STATE__REDIS_URL)",
                  markup=False, style="dim")
        return RedisUserStore(settings.state.redis_url)
    directory = settings.resolved_state_dir()
    path = directory / "linguafusion.sqlite3"
    if not create and not path.exists():
        fail(InvalidParameter(f"no key store in {directory} (no {path.name} there): is --state-dir the folder the "
                              "server was started with? `linguafusion keys create --state-dir DIR` makes one"))
    err.print(f"key store: {path}", markup=False, style="dim")
    import sqlite3

    try:
        return SQLiteStore(directory)
    except (OSError, sqlite3.Error) as exc:  # a file named like the folder, no permission, a corrupt store
        fail(InvalidParameter(f"cannot open the key store in {directory}: {exc}; --state-dir must be a folder "
                              "you can write, holding the server's linguafusion.sqlite3",
                              details={"path": str(path)}))


@keys_app.command("create")
def keys_create(name: str = typer.Option("", "--name", help="A label for the key."),
                admin: bool = typer.Option(False, "--admin", help="Also allow key management (admin scope)."),
                state_dir: Path | None = STATE_OPT) -> None:
    """Create a key; the secret is printed once and stored only as a hash. Create it in the state directory the
    server runs with (--state-dir, or LINGUAFUSION_STATE_DIR), or the server will not know it."""
    store = _key_store(state_dir, create=True)
    try:
        secret, key = store.create_key(name, ("translate", "admin") if admin else ("translate",))
    except LinguaFusionError as exc:  # Redis down: error [backend_unavailable], exit 2
        fail(exc)
    finally:
        store.close()
    sys.stdout.write(f"{secret}\n")
    err.print(f"created {key.key_id} (scopes: {','.join(key.scopes)}); the secret is not stored, keep it safe",
              markup=False)


@keys_app.command("list")
def keys_list(state_dir: Path | None = STATE_OPT) -> None:
    """List the keys of a state directory: id, name, scopes, active or revoked (never the secrets)."""
    store = _key_store(state_dir, create=False)
    try:
        for k in store.list_keys():
            sys.stdout.write(f"{k.key_id}\t{k.name}\t{','.join(k.scopes)}\t{'revoked' if k.revoked else 'active'}\n")
    except LinguaFusionError as exc:
        fail(exc)
    finally:
        store.close()


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="The key's id (key_...), as `keys list` prints it."),
                state_dir: Path | None = STATE_OPT) -> None:
    """Revoke a key: requests with it get 401 from then on."""
    store = _key_store(state_dir, create=False)
    try:
        store.revoke_key(key_id)
    except LinguaFusionError as exc:
        fail(exc)
    finally:
        store.close()
    err.print(f"revoked {key_id}", markup=False)


