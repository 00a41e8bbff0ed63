"""``MultimodalTranslator.local().upload_glossary(dict)`` checks the terms as the server checks the same dict sent
by the HTTP SDK: a non-string or empty target is ``invalid_parameter`` in both modes (local took it before)."""

from __future__ import annotations

import pytest

from lingua_fusion import MultimodalTranslator
from lingua_fusion.errors import InvalidParameter


@pytest.mark.parametrize("terms", [{"bank": 5}, {"bank": ""}, {"": "orilla"}, {"bank": None}])
def test_local_glossary_dict_with_bad_terms_is_refused(terms: dict[str, object]) -> None:
    local = MultimodalTranslator.local()
    with pytest.raises(InvalidParameter):
        local.upload_glossary(terms)  # type: ignore[arg-type]


def test_local_glossary_dict_with_good_terms_is_kept() -> None:
    local = MultimodalTranslator.local()
    assert local.upload_glossary({"bank": "orilla"}).startswith("local_")
