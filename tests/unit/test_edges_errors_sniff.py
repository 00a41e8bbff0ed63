"""Edges of the error map and media sniffing: indexing, unknown codes by status, defaults, magic-byte edges (errors.py
and media/sniff.py).

Found unguarded by mutation testing (``make mutation``, scripts/mutation.py): each test pins a behaviour a
mutant changed while every other test still passed.
"""

from __future__ import annotations

import pytest


def test_a_new_error_class_is_indexed_with_its_subclasses() -> None:
    from lingua_fusion import errors

    class Teapot(errors.ClientError):
        status = 418
        code = "test_teapot"

    class Kettle(Teapot):
        code = "test_kettle"

    try:
        errors._index(Teapot)
        assert errors._BY_CODE["test_teapot"] is Teapot and errors._BY_CODE["test_kettle"] is Kettle
        assert isinstance(errors.from_code("test_kettle", "hot"), Kettle)
    finally:
        errors._BY_CODE.pop("test_teapot", None)
        errors._BY_CODE.pop("test_kettle", None)


@pytest.mark.parametrize("status,client", [(400, True), (499, True), (500, False), (399, False), (None, False)])
def test_an_unknown_code_is_a_client_error_exactly_for_4xx(status: int | None, client: bool) -> None:
    from lingua_fusion.errors import ClientError, LinguaFusionError, from_code

    err = from_code("no_such_code", "m", status=status)
    assert isinstance(err, LinguaFusionError) and isinstance(err, ClientError) is client
    assert err.code == "no_such_code"


def test_overloaded_says_retry_after_one_second_by_default() -> None:
    from lingua_fusion.errors import Overloaded

    assert Overloaded("busy").retry_after == 1.0


@pytest.mark.parametrize("data,container", [
    (b"MM\x00*" + b"\x00" * 20, "tiff"), (b"II*\x00" + b"\x00" * 20, "tiff"),
    (b"\xff", "unknown"), (b"\xff\xfb", "mp3"), (b"\xff\xf1", "aac"),
    (b"a" * 4096 + b"\xff", "text"), (b"a" * 4096 + b"\x00", "text"), (b"a" * 4095 + b"\x00", "unknown"),
])
def test_sniff_edges(data: bytes, container: str) -> None:
    from lingua_fusion.media.sniff import sniff

    assert sniff(data).container == container
