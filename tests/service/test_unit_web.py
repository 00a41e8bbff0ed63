"""The pure parts behind the web pages: the stream-ticket book (fake clock) and the quantile the ops page shows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from lingua_fusion.api.opsview import histogram_quantile, snapshot
from lingua_fusion.api.shared_tickets import SharedTicketBook
from lingua_fusion.api.tickets import PREFIX, TicketBook, is_ticket
from lingua_fusion.errors import AuthenticationError


def test_a_ticket_is_redeemed_once_for_its_key() -> None:
    book = TicketBook(ttl_s=60)
    ticket = book.issue("key_a", admin=False, now=100.0)
    assert ticket is not None and is_ticket(ticket.token) and ticket.token.startswith(PREFIX)
    assert book.redeem(ticket.token, now=101.0).key_id == "key_a"
    with pytest.raises(AuthenticationError):
        book.redeem(ticket.token, now=101.5)
    assert len(book) == 0


def test_a_ticket_expires_after_its_ttl() -> None:
    book = TicketBook(ttl_s=60)
    ticket = book.issue("key_a", admin=True, now=0.0)
    assert ticket is not None
    with pytest.raises(AuthenticationError) as err:
        book.redeem(ticket.token, now=60.0)
    assert err.value.code == "unauthenticated" and len(book) == 0


def test_tickets_are_bounded_per_key_and_in_all() -> None:
    book = TicketBook(ttl_s=60, max_tickets=5, per_key=3)
    assert all(book.issue("a", False, now=0.0) for _ in range(3))
    assert book.issue("a", False, now=1.0) is None  # a's share is full
    assert book.issue("b", False, now=1.0) and book.issue("b", False, now=1.0)
    assert book.issue("c", False, now=1.0) is None  # the book is full
    assert book.issue("a", False, now=61.0) is not None  # a's first tickets expired


def test_revoking_a_key_drops_its_tickets() -> None:
    book = TicketBook()
    mine, other = book.issue("a", False, now=0.0), book.issue("b", False, now=0.0)
    assert mine and other and book.revoke("a") == 1
    with pytest.raises(AuthenticationError):
        book.redeem(mine.token, now=1.0)
    assert book.redeem(other.token, now=1.0).key_id == "b"


def test_unknown_tokens_and_keys_are_not_tickets() -> None:
    assert not is_ticket(None) and not is_ticket("") and not is_ticket("sk_abc")
    with pytest.raises(AuthenticationError):
        TicketBook().redeem(PREFIX + "made-up", now=0.0)


def test_a_ticket_from_one_worker_is_redeemed_once_by_another(tmp_path: Path) -> None:
    """``serve --workers``: the ticket's POST and its WebSocket land on whichever worker accepts each connection;
    with one in-memory book per worker every ticket redeemed on the other worker was 'unauthenticated' (the
    live-captions page could not open a stream). Two books on one file stand for two workers."""
    path = tmp_path / "tickets.db"
    a, b = SharedTicketBook(path, ttl_s=60, max_tickets=5, per_key=3), SharedTicketBook(path, ttl_s=60,
                                                                                           max_tickets=5, per_key=3)
    ticket = a.issue("key_a", admin=True, now=100.0)
    assert ticket is not None and is_ticket(ticket.token)
    redeemed = b.redeem(ticket.token, now=101.0)
    assert (redeemed.key_id, redeemed.admin) == ("key_a", True)
    for book in (a, b):  # once, on any worker
        with pytest.raises(AuthenticationError):
            book.redeem(ticket.token, now=101.5)
    assert a.issue("k", False, now=0.0) and b.issue("k", False, now=0.0) and a.issue("k", False, now=0.0)
    assert b.issue("k", False, now=1.0) is None  # the key's share, counted across workers
    assert a.issue("j", False, now=1.0) and b.issue("j", False, now=1.0) and a.issue("i", False, now=1.0) is None
    assert b.issue("k", False, now=61.0) is not None  # k's first tickets expired
    late = a.issue("j", False, now=61.0)
    assert late is not None and b.revoke("j") == 1 and len(a) == 1  # revoked on one worker, gone on both
    with pytest.raises(AuthenticationError):
        a.redeem(late.token, now=62.0)
    expiring = b.issue("m", False, now=100.0)
    assert expiring is not None
    with pytest.raises(AuthenticationError):
        a.redeem(expiring.token, now=160.0)
    assert expiring.token.encode() not in path.read_bytes()  # digests only
    a.close()
    b.close()


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    # 10 observations: 4 in (0, 0.1], 4 in (0.1, 0.5], 2 in (0.5, 1]
    buckets = [(0.1, 4.0), (0.5, 8.0), (1.0, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (5 - 4) / 4)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (9.9 - 8) / 2)
    assert histogram_quantile(0.2, buckets) == pytest.approx(0.05)
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.99, [(0.1, 1.0), (math.inf, 5.0)]) == 0.1  # in +Inf: the largest finite bound


def test_the_snapshot_holds_the_registry_samples_and_its_digest() -> None:
    registry = CollectorRegistry()
    admitted = Counter("linguafusion_streams_admitted_total", "x", registry=registry)
    stage = Histogram("linguafusion_stage_latency_seconds", "x", ["stage"], buckets=(0.1, 1.0), registry=registry)
    admitted.inc(3)
    for v in (0.05, 0.2, 0.3):
        stage.labels(stage="model:asr").observe(v)
    snap = snapshot(registry, now=5.0)
    assert snap["time"] == 5.0
    assert {"name": "linguafusion_streams_admitted_total", "labels": {}, "value": 3.0} in snap["samples"]
    assert snap["summary"]["streams_admitted"] == 3.0
    asr = snap["summary"]["stages"]["model:asr"]
    assert asr["count"] == 3.0 and asr["sum"] == pytest.approx(0.55)
    assert asr["buckets"] == [[0.1, 1.0], [1.0, 3.0], ["+Inf", 3.0]]
    assert asr["p50"] == pytest.approx(0.1 + 0.9 * (1.5 - 1) / 2)


def test_an_unused_ticket_is_masked_in_logs() -> None:
    from lingua_fusion.redact import redact

    line = 'GET /v1/streams?ticket=wst_abc123&x=1 HTTP/1.1" 101'
    assert "wst_abc123" not in redact(line) and "x=1" in redact(line)
