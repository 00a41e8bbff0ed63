"""Every Redis key name the project uses, in one place."""

PREFIX = "lf:"


def stream_log(stream_id: str) -> str:
    """List of committed final events (JSON), in sequence order: the write-ahead log."""
    return f"{PREFIX}stream:{stream_id}:log"


def stream_snapshot(stream_id: str) -> str:
    """Hash: the state needed to continue the stream (spec, token digest, last seq, committed_until, ...)."""
    return f"{PREFIX}stream:{stream_id}:snap"
