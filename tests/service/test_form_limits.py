"""A text field too long for the form parser (over 4 x max_text_chars bytes) is a 413 ``too_large`` naming the
limit, like a text of 26,000 characters; it was a 400 ``invalid_parameter`` 'malformed form body: ... 78KB'."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import Server


@pytest.mark.parametrize("multipart", [True, False])
def test_a_very_long_text_field_is_too_large(server: Server, multipart: bool) -> None:
    fields = {"text": "hello world. " * 20_000, "target_lang": "es", "source_lang": "en"}
    body: dict[str, Any] = ({"files": {k: (None, v) for k, v in fields.items()}} if multipart  # every field a part
                            else {"data": fields})  # application/x-www-form-urlencoded
    r = httpx.post(f"{server.url}/v1/translate", headers={"Authorization": f"Bearer {server.admin_key}"},
                   timeout=60, **body)
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["code"] == "too_large"
    assert error["details"]["limit"] == "max_text_chars"
