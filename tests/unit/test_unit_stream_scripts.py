"""A stream's Chinese in the script its tags ask for (zh: Simplified, zh-TW / zh-Hant / zh-HK: Traditional), for
the transcript and for the captions; the start message, the spec kept for a resume, and the jobs on fakes."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakePort, drain, session

from lingua_fusion.errors import InvalidParameter
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrOutput
from lingua_fusion.stream.protocol import StreamSpec, parse_start

TRADITIONAL = "今天天氣很好，請問火車站在哪裡"
SIMPLIFIED = "今天天气很好，请问火车站在哪里"


def _start(source: str, *targets: str) -> StreamSpec:
    return parse_start({"type": "start", "source_lang": source, "target_langs": list(targets)},
                       lambda s, t: None, [])


def test_the_start_message_keeps_the_script_its_tags_ask_for() -> None:
    spec = _start("zh-TW", "en")
    assert (spec.source_lang, spec.source_script, spec.target_scripts) == ("zh", "Hant", {})
    assert spec.scripts() == {"source": "zh-Hant (Traditional)"}
    assert _start("zh", "en").source_script == "Hans" and _start("cmn", "en").source_script == "Hans"
    assert _start("zh_hk", "en").source_script == "Hant" and _start("zh-Hant", "en").source_script == "Hant"
    spec = _start("en", "zh-TW", "es")
    assert (spec.targets, spec.target_scripts, spec.source_script) == (["zh", "es"], {"zh": "Hant"}, None)
    assert _start("en", "zh-CN").target_scripts == {"zh": "Hans"}
    assert _start("en", "es").scripts() is None  # no Chinese, nothing said


def test_one_stream_has_one_chinese_script() -> None:
    with pytest.raises(InvalidParameter, match="not both"):
        _start("en", "zh", "zh-TW")
    assert _start("en", "zh", "zh-CN").target_scripts == {"zh": "Hans"}  # the same script twice is no conflict


def test_a_resumed_stream_keeps_its_scripts() -> None:
    spec = _start("zh-TW", "zh-TW")
    again = StreamSpec.from_dict(spec.to_dict(), spec.stream_id, spec.resume_token)
    assert (again.source_script, again.target_scripts) == ("Hant", {"zh": "Hant"})
    old = {k: v for k, v in spec.to_dict().items() if k not in ("source_script", "target_scripts")}
    old["source_lang"], old["targets"] = "zh", ["zh"]
    before = StreamSpec.from_dict(old, spec.stream_id, spec.resume_token)  # logged before scripts were kept
    assert (before.source_script, before.target_scripts) == ("Hans", {"zh": "Hans"})  # what zh was then


def _heard(text: str) -> FakePort:
    """ASR says ``text`` (Whisper writes Mandarin in either script); MT says SIMPLIFIED, as the engines do."""
    def answer(key: ModelKey, payload: object) -> object:
        if key.task == "asr":
            return AsrOutput(text, 0.9)
        return SIMPLIFIED if key.task == "mt" else None
    return FakePort(on_call=answer)


@pytest.mark.parametrize(("source", "heard", "said"), [("zh-TW", SIMPLIFIED, TRADITIONAL),
                                                       ("zh", TRADITIONAL, SIMPLIFIED)], ids=["zh-TW", "zh"])
async def test_a_transcript_comes_in_the_script_the_source_tag_asks_for(source: str, heard: str, said: str) -> None:
    spec = _start(source, source)  # a transcription: the caption is the transcript
    s = session(_heard(heard), spec=spec)
    s.start()
    tentative = await s.jobs.partial(np.zeros(16000, dtype="float32"), lambda: True)
    assert tentative is not None and tentative.text == said and tentative.translation == said
    final = await s.jobs.commit(np.zeros(16000, dtype="float32"), 0.0, 1.0, 0.0)
    assert final is not None and final.source_text == said and final.translations == {"zh": said}
    assert final.to_wire()["scripts"] == spec.scripts()
    await s.end()
    await drain(s)


async def test_a_caption_comes_in_the_script_the_target_tag_asks_for() -> None:
    s = session(_heard("hello"), spec=_start("en", "zh-TW", "es"))
    ready = s.start().to_wire()
    await s.feed_text("The weather is fine today.")
    await s.end()
    final = next(e for e in await drain(s) if e["type"] == "final")
    assert final["translations"]["zh"] == TRADITIONAL and final["text"] == TRADITIONAL
    assert final["translations"]["es"] == SIMPLIFIED  # (the fake's MT) only Chinese is converted
    assert final["scripts"] == ready["scripts"] == {"zh": "zh-Hant (Traditional)"}
