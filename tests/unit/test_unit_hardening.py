"""Pure pieces of the hardening (issue 10): the compiled glossary matcher, the deadline inside the work, secret
redaction (messages and log records), the Host / Origin policy and the body limits per route."""

from __future__ import annotations

import logging
import random
import re
import string

import pytest

from lingua_fusion import glossary
from lingua_fusion.api.guard import Policy, body_limit
from lingua_fusion.config import Settings
from lingua_fusion.deadline import Deadline
from lingua_fusion.errors import (
    BackendError,
    HostNotAllowed,
    InvalidParameter,
    OriginNotAllowed,
    RequestTimeout,
    StoreUnavailable,
)
from lingua_fusion.glossary import Term, apply_mt, protect
from lingua_fusion.redact import SecretFilter, redact


def words(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return list(dict.fromkeys("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9)))
                              for _ in range(n)))


def one_by_one(text: str, terms: list[Term]) -> set[str]:
    """The terms a per-term search finds (the old way: one pattern per term)."""
    return {t.source for t in terms
            if re.search(r"(?<!\w)" + re.escape(t.source) + r"(?!\w)", text, re.IGNORECASE)}


# ---- the glossary matcher ----------------------------------------------------------------------------------
def test_a_glossary_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    glossary._matcher.cache_clear()
    compiled = []
    real = glossary._compile
    monkeypatch.setattr(glossary, "_compile", lambda keys: compiled.append(len(keys)) or real(keys))
    terms = [Term(w, w.upper()) for w in words(5000)]
    segments = [f"segment {i} says {terms[i * 7].source} and {terms[i * 11].source}." for i in range(40)]
    for s in segments:
        protect(s, terms)
    assert compiled == [len(terms)]  # 40 segments, one compilation (it was 5,000 a segment)


def test_the_matcher_finds_what_a_per_term_search_finds() -> None:
    rng = random.Random(1)
    vocab = words(600, seed=2)
    terms = [Term(w, "T") for w in vocab[:300]] + [Term(f"{a} {b}", "T") for a, b in zip(vocab[300:400],
                                                                                        vocab[400:500], strict=True)]
    for _ in range(200):
        text = " ".join(rng.choice(vocab).capitalize() if rng.random() < 0.2 else rng.choice(vocab)
                        for _ in range(12))
        _out, found = protect(text, terms)
        got = {t.source for t in found.values()}
        # every term found is really there, and a term the per-term search finds is found unless a longer term
        # overlapping it took its place
        assert got <= one_by_one(text, terms)
        for missed in one_by_one(text, terms) - got:
            assert any(missed in t and len(t) > len(missed) for t in got), (text, missed, got)


def test_longest_term_wins_and_word_boundaries_hold() -> None:
    terms = [Term("new", "N"), Term("new york", "NY"), Term("york", "Y")]
    text, found = protect("New York, new yorkshire, renew.", terms)
    assert [t.source for t in found.values()] == ["new york", "new"]
    assert "yorkshire" in text and "renew" in text


def test_a_deep_trie_compiles() -> None:
    terms = [Term("a" * i, str(i)) for i in range(1, glossary.MAX_TERM_CHARS + 1)]
    _text, found = protect("aaa " + "a" * 50, terms)
    assert sorted(len(t.source) for t in found.values()) == [3, 50]


def test_terms_are_bounded_in_length() -> None:
    with pytest.raises(InvalidParameter, match="at most"):
        glossary.parse(("x" * (glossary.MAX_TERM_CHARS + 1) + ",y\n").encode(), max_terms=10)


def test_slide_names_are_matched_after_the_glossary() -> None:
    text, found = protect("Acme sells the bank", [Term("bank", "banco")], [Term("Acme", "Acme")])
    assert text == "[901] sells the [900]" and found["[900]"].target == "banco"


def test_the_deadline_is_checked_inside_the_work() -> None:
    clock = [0.0]
    deadline = Deadline(3.0, clock=lambda: clock[0])
    calls: list[list[str]] = []

    def translate(texts: list[str]) -> list[str]:
        calls.append(texts)
        return texts

    apply_mt(["one bank", "two banks"], [Term("bank", "banco")], translate, deadline=deadline)
    clock[0] = 3.5
    with pytest.raises(RequestTimeout) as err:
        apply_mt(["one bank"], [Term("bank", "banco")], translate, deadline=deadline)
    assert err.value.status == 504 and len(calls) == 1  # stopped before the second translation


# ---- secrets out of messages and logs ----------------------------------------------------------------------
def test_redact() -> None:
    key = "sk_" + "A1b2" * 11
    assert redact(f"bad key {key}") == "bad key sk_***"
    assert redact("redis://:hunter2@10.0.0.5:6379/0") == "redis://:***@10.0.0.5:6379/0"
    assert redact("redis://default:hunter2@h/0") == "redis://default:***@h/0"
    assert redact(f'"WebSocket /v1/streams?lang=en&api_key={key}&x=1"') == \
        '"WebSocket /v1/streams?lang=en&api_key=***&x=1"'
    assert redact("nothing secret: sk_short, image/png") == "nothing secret: sk_short, image/png"


def test_redact_is_linear_on_long_runs() -> None:
    # a 60,000-character path in a 404 message took 7 s through the first URL pattern (quadratic backtracking)
    for text in ("a" * 200_000, "redis" * 40_000, "sk_" * 60_000, "?api_key" * 20_000):
        assert len(redact(text)) <= len(text)


def test_secret_filter_masks_arguments() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s"',
                               ("127.0.0.1:5", "GET", "/v1/streams?api_key=sk_" + "x" * 40), None)
    assert SecretFilter().filter(record)
    assert "sk_x" not in record.getMessage() and "api_key=***" in record.getMessage()


def test_server_side_failures_get_a_plain_message() -> None:
    err = BackendError("cannot load Whisper model from /root/.cache/linguafusion/whisper-base: boom")
    assert "/root" not in err.public_message and err.to_dict()["message"] == BackendError.public
    assert "6379" not in StoreUnavailable("Redis failed: Error 111 connecting to 10.0.0.5:6379").public_message
    assert InvalidParameter("ts must be finite").public_message == "ts must be finite"


# ---- Host / Origin policy, body limits ---------------------------------------------------------------------
def settings(auth: bool, **server: object) -> Settings:
    s = Settings()
    s.server.auth = auth
    for k, v in server.items():
        setattr(s.server, k, v)
    return s


def test_with_auth_any_host_and_origin_by_default() -> None:
    p = Policy(settings(True))
    p.check_host("evil.example")
    p.check_origin("http://evil.example", "evil.example")


def test_without_auth_loopback_hosts_and_the_same_origin_only() -> None:
    p = Policy(settings(False))
    for host in ("127.0.0.1:8000", "localhost", "LOCALHOST.", "[::1]:8000"):
        p.check_host(host)
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "", None):
        with pytest.raises(HostNotAllowed):
            p.check_host(host)
    p.check_origin(None, "127.0.0.1:8000")  # not a browser
    p.check_origin("http://127.0.0.1:8000", "127.0.0.1:8000")
    p.check_origin("http://[::1]:8000", "[::1]:8000")
    for origin in ("http://evil.example", "http://127.0.0.1:9999", "null", "https://127.0.0.1:8000"):
        with pytest.raises(OriginNotAllowed):
            p.check_origin(origin, "127.0.0.1:8000")


def test_allow_lists_from_settings() -> None:
    p = Policy(settings(True, allowed_hosts=["*.example.com", "api.local"],
                        allowed_origins=["https://app.example.com/"]))
    p.check_host("eu.example.com:443")
    p.check_host("api.local")
    with pytest.raises(HostNotAllowed):
        p.check_host("example.org")
    p.check_origin("https://app.example.com", "api.local")
    with pytest.raises(OriginNotAllowed):
        p.check_origin("https://evil.example.com", "api.local")


def test_body_limits_per_route() -> None:
    s = Settings()
    s.limits.max_upload_bytes = 1 << 20
    assert (1 << 20) < body_limit(s, "POST", "/v1/translate") < (1 << 20) + 256 * 1024
    assert (1 << 20) < body_limit(s, "POST", "/v1/glossaries") <= (1 << 20) + 64 * 1024
    assert body_limit(s, "POST", "/v1/keys") == body_limit(s, "GET", "/healthz") == s.limits.max_json_bytes
