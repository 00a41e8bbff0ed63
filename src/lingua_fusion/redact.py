"""Secrets out of text: API keys, passwords in URLs, key-bearing query parameters.

``redact`` is applied to every message a client reads (``LinguaFusionError.public_message``) and, through
``SecretFilter``, to every log record the server writes (uvicorn's access and error logs included: a browser that
still passes ``?api_key=`` must not leave its key in the access log).
"""

from __future__ import annotations

import logging
import re

# an API key as the key store makes them ("sk_" + 43 URL-safe characters); shorter runs are not keys
_API_KEY = re.compile(r"sk_[A-Za-z0-9_\-]{16,}")
# user:password@ in any URL (redis://:pw@host, redis://user:pw@host, http://u:p@host); every repetition is bounded,
# so a long run of letters (a 60,000-character path in an error message) costs linear time, not quadratic
_URL_PASSWORD = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]{0,31}://)(?P<user>[^:/@\s]{0,256}):[^@/\s]{0,1024}@")
# query parameters that carry credentials
_QUERY_SECRET = re.compile(r"(?P<name>[?&](?:api_key|apikey|key|token|access_token|resume_token|ticket|password)=)"
                           r"[^&\s\"']*", re.IGNORECASE)
MASK = "***"


def redact(text: str) -> str:
    """``text`` with credentials replaced by ``***`` (the rest left as it was)."""
    if not text:
        return text
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _QUERY_SECRET.sub(lambda m: m["name"] + MASK, text)
    return _API_KEY.sub("sk_" + MASK, text)


def redact_url(url: str) -> str:
    """A URL fit for a log line: its password (and any key-bearing query parameter) masked."""
    return redact(url)


class SecretFilter(logging.Filter):
    """Redacts a record's message and arguments (never drops a record). Attach it to handlers: a handler's
    filters see the records of every logger that propagates to it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


def install(*loggers: str) -> None:
    """Attach one SecretFilter to every handler of ``loggers`` (and of the root logger)."""
    seen: set[int] = set()
    for name in ("", *loggers):
        for handler in logging.getLogger(name).handlers:
            if id(handler) not in seen and not any(isinstance(f, SecretFilter) for f in handler.filters):
                handler.addFilter(SecretFilter())
            seen.add(id(handler))
