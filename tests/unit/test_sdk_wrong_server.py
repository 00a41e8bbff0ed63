"""The HTTP SDK pointed at something that is not a LinguaFusion server (a wrong port, a proxy's page, another
program's JSON): a typed ``LinguaFusionError`` with a code, never a JSONDecodeError, AttributeError or a pydantic
ValidationError escaping to the caller (the CLI prints a traceback for those)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from conftest import free_port

from lingua_fusion import AsyncMultimodalTranslator, MultimodalTranslator
from lingua_fusion.config import ServerSettings
from lingua_fusion.errors import BackendError, LinguaFusionError, RequestTimeout


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


# ---- a server that is down or hung: a typed error within the SDK's limits, not a 10-minute hang ----
@contextlib.contextmanager
def _silent_server() -> Iterator[str]:
    """A TCP port whose connections are accepted (by the kernel's backlog) and never answered: a hung server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_default_waits_for_the_servers_own_timeout_and_not_much_longer() -> None:
    """The answer to a file request comes by server.request_timeout_s (a 504 then): the SDK waits that long plus
    room for the upload, where it waited 600 s; connecting waits 10 s. A smaller ``timeout=`` caps both."""
    server_limit = ServerSettings().request_timeout_s
    with MultimodalTranslator(base_url="http://127.0.0.1:9") as t:
        assert server_limit < (t._http.timeout.read or 0) <= 1.2 * server_limit
        assert t._http.timeout.connect == 10.0
    with MultimodalTranslator(base_url="http://127.0.0.1:9", timeout=2.0) as t:
        assert (t._http.timeout.read, t._http.timeout.connect) == (2.0, 2.0)


def test_a_hung_server_fails_the_call_with_a_timeout_error() -> None:
    outcome: list[BaseException] = []

    def call(url: str) -> None:
        with MultimodalTranslator(api_key="sk_x", base_url=url, timeout=0.5) as t:
            try:
                t.translate(text="Good morning", source_lang="en", target_lang="es")
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                outcome.append(exc)

    with _silent_server() as url:
        caller = threading.Thread(target=call, args=(url,), daemon=True)
        caller.start()
        caller.join(timeout=60)  # a guard against a hang, not a measure
        assert not caller.is_alive(), "the call did not return"
    assert len(outcome) == 1 and isinstance(outcome[0], RequestTimeout), outcome
    assert outcome[0].code == "timeout" and outcome[0].retryable


async def test_a_hung_server_fails_the_async_call_with_a_timeout_error() -> None:
    with _silent_server() as url:
        async with AsyncMultimodalTranslator(api_key="sk_x", base_url=url, timeout=0.5) as t:
            with pytest.raises(RequestTimeout):
                await asyncio.wait_for(t.models(), 60)


def test_a_port_nobody_listens_on_is_backend_unavailable() -> None:
    with MultimodalTranslator(base_url=f"http://127.0.0.1:{free_port()}", timeout=0.5) as t, \
            pytest.raises(BackendError, match="cannot reach") as info:
        t.models()
    assert info.value.code == "backend_unavailable"
