"""State on disk is private: the state directory 0700, its files 0600 (they hold key digests, glossaries and
stream transcripts). SQLite gives its -wal / -shm / -journal files the mode of the database file."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("lingua_fusion.state")
SIDECARS = ("-wal", "-shm", "-journal")


def private_dir(path: Path) -> Path:
    """Create ``path`` 0700 (tightening it when it exists and is ours)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _tighten(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty and 0600 unless it exists; tighten it (and its SQLite sidecars) to 0600.

    An existing file is never opened here: closing any descriptor of a file drops every POSIX lock this process
    holds on it, so a second store opened on a database this process already uses (the key store and the
    vocabulary store share linguafusion.sqlite3) would silently drop the first one's WAL lock; another process
    (``linguafusion keys create``) then believes it is the last user, checkpoints and removes the WAL under the
    server, whose next read fails with "database disk image is malformed"."""
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    for p in (path, *(path.with_name(path.name + s) for s in SIDECARS)):
        if p.exists():
            _tighten(p, 0o600)
    return path


def _tighten(path: Path, mode: int) -> None:
    st = path.stat()
    if st.st_mode & 0o777 == mode:
        return
    if st.st_uid != os.getuid():
        log.warning("%s is not ours (uid %d): left at mode %o", path, st.st_uid, st.st_mode & 0o777)
        return
    os.chmod(path, mode)
