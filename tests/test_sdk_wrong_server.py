"""The HTTP SDK pointed at something that is not a LinguaFusion server (a wrong port, a proxy's page, another
program's JSON): a typed ``LinguaFusionError`` with a code, never a JSONDecodeError, AttributeError or a pydantic
ValidationError escaping to the caller (the CLI prints a traceback for those)."""

from __future__ import annotations

import httpx
import pytest

from lingua_fusion import MultimodalTranslator
from lingua_fusion.errors import BackendError, LinguaFusionError


def _client(status: int, body: bytes, ctype: str) -> MultimodalTranslator:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": ctype})

    t = MultimodalTranslator(api_key="sk_x", base_url="http://wrong.example")
    t._http = httpx.Client(base_url=t.base_url, transport=httpx.MockTransport(answer))
    return t


@pytest.mark.parametrize(("status", "body", "ctype", "expected"), [
    (200, b"not json at all", "application/json", BackendError),      # JSONDecodeError before
    (200, b'{"weird": 1}', "application/json", BackendError),         # pydantic ValidationError before
    (200, b"<html>welcome to nginx</html>", "text/html", BackendError),
    (200, b"[1, 2]", "application/json", BackendError),
    (400, b'{"error": "bad thing"}', "application/json", LinguaFusionError),  # AttributeError before
    (502, b"not json", "application/json", LinguaFusionError),
])
def test_translate_against_a_foreign_server_raises_a_typed_error(status: int, body: bytes, ctype: str,
                                                                 expected: type[Exception]) -> None:
    with _client(status, body, ctype) as t, pytest.raises(expected) as info:
        t.translate(text="Good morning", source_lang="en", target_lang="es")
    assert info.value.code
    if status == 400:
        assert "bad thing" in str(info.value)


def test_other_calls_against_a_foreign_server_raise_a_typed_error() -> None:
    with _client(200, b"<html>hi</html>", "text/html") as t:
        with pytest.raises(BackendError):
            t.models()
        with pytest.raises(BackendError):
            t.rooms()


@pytest.mark.parametrize("url", ["::::", "http://[::1", "notaurl", "ftp://127.0.0.1:8000"])
def test_a_malformed_server_url_is_an_invalid_parameter(url: str) -> None:
    """httpx.InvalidURL used to escape from the first request (a traceback on the CLI's --url)."""
    from lingua_fusion.errors import InvalidParameter

    with pytest.raises(InvalidParameter) as info:
        MultimodalTranslator(api_key="sk_x", base_url=url)
    assert info.value.details["field"] == "base_url"


def test_a_non_ascii_api_key_is_an_invalid_parameter() -> None:
    """httpx raised UnicodeEncodeError building the Authorization header (a traceback on the CLI's --api-key)."""
    from lingua_fusion.errors import InvalidParameter

    with pytest.raises(InvalidParameter) as info:
        MultimodalTranslator(api_key="sk_é", base_url="http://127.0.0.1:8000")
    assert info.value.details["field"] == "api_key"
