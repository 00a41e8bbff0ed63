"""Where a WebSocket handshake carries its secret (a key or a listener token): browsers cannot set headers on a
WebSocket, so a secret may also come as a subprotocol ``<prefix><secret>``; the server answers with one of its own
subprotocols, never the secret. What else a route accepts (a single-use ticket, ``?token=``) is the route's."""

from __future__ import annotations

from fastapi import WebSocket


def offered_secret(ws: WebSocket, *, answers: tuple[str, ...], prefix: str) -> tuple[str | None, str | None]:
    """(the secret from ``Authorization: Bearer`` or else from a ``prefix`` subprotocol, or None; the subprotocol
    to answer with: the first of ``answers`` the client offered, or None)."""
    offered = [p.strip() for p in ws.scope.get("subprotocols", [])]
    chosen = next((p for p in answers if p in offered), None)
    header = ws.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip(), chosen
    for p in offered:
        if p.lower().startswith(prefix.lower()):
            return p[len(prefix):], chosen
    return None, chosen
