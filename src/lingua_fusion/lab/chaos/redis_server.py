"""A redis-server that chaos experiments and benchmarks own: started with AOF on, killed, restarted on its data.

Debian's ``redis-server`` binary (installed by scripts/setup.sh) runs in the foreground as a child process, on a
free loopback port, with its data in its own directory, so SIGKILL and a restart replay the append-only file exactly
as a crashed production Redis would.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ...errors import InvalidParameter


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ManagedRedis:
    def __init__(self, data_dir: Path, *, appendfsync: str = "everysec", port: int = 0) -> None:
        if appendfsync not in ("always", "everysec", "no"):
            raise InvalidParameter("appendfsync must be always, everysec or no")
        self.data_dir = data_dir
        self.appendfsync = appendfsync
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 30.0) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise InvalidParameter("redis-server is not installed (scripts/setup.sh installs it)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir), "--appendonly", "yes",
             "--appendfsync", self.appendfsync, "--save", "", "--daemonize", "no", "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise InvalidParameter(f"redis-server exited: see {self.data_dir / 'redis.log'}")
            if self._pong():
                return
            time.sleep(0.05)
        raise InvalidParameter(f"redis-server did not answer in {timeout_s:.0f} s")

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync (what a crash does to the process)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
