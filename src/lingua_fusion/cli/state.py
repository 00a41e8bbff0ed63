"""``linguafusion state migrate --to redis URL``: move one state directory's keys, glossaries and vocabularies into
Redis (state/migrate.py), so that every server on that Redis serves them (docs/cluster.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from ..errors import InvalidParameter, LinguaFusionError
from .app import STATE_OPT, _settings, app
from .output import err, fail

state_app = typer.Typer(help="The server's state: move it from a state directory into Redis.", no_args_is_help=True)
app.add_typer(state_app, name="state")


@state_app.command("migrate")
def migrate(to: tuple[str, str] = typer.Option(..., "--to", metavar="redis URL",
                                                help="Where to: 'redis' and the Redis URL (redis://host:port/db)."),
            state_dir: Path | None = STATE_OPT) -> None:
    """Copy the state directory's API keys (their digests: the keys keep working), glossaries and vocabularies
    into Redis, then read the copy back and check it. Safe to run again: what Redis holds already is left as it
    is. Prints what it copied as JSON."""
    kind, url = to
    if kind != "redis" or not url.startswith(("redis://", "rediss://", "unix://")):
        fail(InvalidParameter("--to takes 'redis' and a Redis URL, e.g. --to redis redis://127.0.0.1:6379/0"))
    from ..redact import redact_url
    from ..state.migrate import copy_users, verify
    from ..state.redis_users import RedisUserStore
    from ..state.sqlite import SQLiteStore

    directory = _settings(state_dir).resolved_state_dir()
    if not (directory / "linguafusion.sqlite3").exists():
        fail(InvalidParameter(f"no key store in {directory} (no linguafusion.sqlite3 there): is --state-dir the "
                              "folder the server ran with?"))
    err.print(f"from {directory} to Redis at {redact_url(url)}", markup=False, style="dim")
    src, dst = SQLiteStore(directory), RedisUserStore(url)
    try:
        copied = copy_users(src, dst)
        copied.vocabularies, vocabulary_problems = _copy_vocabularies(directory, url)
        copied.problems = verify(src, dst) + vocabulary_problems
    except LinguaFusionError as exc:  # Redis down or refusing: error [backend_unavailable], exit 2
        fail(exc)
    finally:
        src.close()
        dst.close()
    sys.stdout.write(json.dumps(copied.to_dict()) + "\n")
    if copied.problems:
        fail(InvalidParameter(f"the copy differs from the state directory: {'; '.join(copied.problems[:5])}"))
    err.print(f"copied {copied.keys} keys, {copied.glossaries} glossaries and {copied.vocabularies} vocabularies "
              f"({copied.keys_there} keys and {copied.glossaries_there} glossaries were there already); verified. "
              "Serve with LINGUAFUSION_STATE__REDIS_URL set to this URL.", markup=False)


def _copy_vocabularies(directory: Path, url: str) -> tuple[int, list[str]]:
    """The state directory's vocabularies with their examples copied (none when it has no vocabulary store), and
    what of them the copy lacks: a vocabulary missing, or with fewer examples."""
    if not (directory / "vocabularies.sqlite3").exists():
        return 0, []
    from ..vision.redis_store import RedisVocabularyStore
    from ..vision.store import VocabularyStore
    from ..vision.vocab_copy import copy_vocabularies

    src, dst = VocabularyStore(directory), RedisVocabularyStore(url)
    try:
        n = copy_vocabularies(src, dst)
        problems = []
        for owner in src.owners():
            there = {v.vocab_id: v for v in dst.list(owner)}
            for v in src.list(owner):
                if v.vocab_id not in there or there[v.vocab_id].examples < v.examples:
                    problems.append(f"vocabulary {v.vocab_id} is missing or lacks examples")
        return n, problems
    finally:
        src.close()
        dst.close()
