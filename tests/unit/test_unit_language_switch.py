"""Language per utterance on a ``source_lang: "auto"`` stream, without models: the decision (stream/languages.py),
the start message's candidates (stream/protocol.py), admission's demand, and a session on the fake port whose
detector and recogniser answer per utterance (tests/fakes.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fakes import FakeOwner, FakePort, drain, session

from lingua_fusion.errors import InvalidParameter, UnsupportedPair
from lingua_fusion.models.base import among
from lingua_fusion.models.routes import MTLeg, MTRoute
from lingua_fusion.serving.demand import stream_demand
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, DetectInput
from lingua_fusion.stream.languages import SURE, decide
from lingua_fusion.stream.protocol import StreamSpec, parse_start

ROUTED = {"en", "es", "de"}  # the fake server routes between these three only; de -> en through the tiny LLM


def check_pair(source: str, target: str) -> MTRoute:
    if source not in ROUTED or target not in ROUTED:
        raise UnsupportedPair(f"{source}->{target}")
    return MTRoute((MTLeg("x", source, target),), low_confidence=(source, target) == ("de", "en"))


def start(**kw: Any) -> StreamSpec:
    return parse_start({"type": "start", "target_langs": ["en"], **kw}, check_pair, [])


def test_a_sure_detection_is_taken_and_an_unsure_one_keeps_the_stream_s_language() -> None:
    sure = decide({"en": 0.1, "es": 0.8, "de": 0.1}, "de", "en")
    assert (sure.lang, sure.confidence, sure.unsure) == ("es", 0.8, False)
    unsure = decide({"en": 0.3, "es": 0.4, "de": 0.3}, "de", "en")
    assert (unsure.lang, unsure.heard, unsure.confidence, unsure.unsure) == ("de", "es", 0.3, True)
    assert "es scored 0.40 among en, es, de; kept de" in str(unsure.note(["en", "es", "de"]))
    first = decide({"en": 0.3, "es": 0.4, "de": 0.3}, None, "en")  # nothing heard surely yet: the best guess
    assert (first.lang, first.unsure) == ("es", True) and "taken as heard" in str(first.note(["en", "es", "de"]))
    failed = decide({}, "de", "en")  # the detection failed: the previous language
    assert (failed.lang, failed.unsure) == ("de", True)
    assert decide({"en": SURE, "es": SURE}, None, "en").unsure is False  # the threshold itself is sure


def test_candidates_are_renormalised_over_the_stream_s_languages() -> None:
    assert among({"es": 0.3, "gl": 0.5, "en": 0.1, "pt": 0.1}, ["en", "es"]) == {"en": 0.25, "es": 0.75}
    assert among({"fr": 1.0}, ["en", "es"]) == {"en": 0.5, "es": 0.5}  # no weight on any: it cannot tell


def test_auto_detects_among_the_languages_routed_to_every_target() -> None:
    spec = start(source_lang="auto")
    assert spec.source_langs == ["en", "es", "de"] and spec.detects and spec.source_lang == "en"
    assert spec.low_targets("de") == ["en"] and spec.low_targets("es") == []
    assert StreamSpec.from_dict(spec.to_dict(), spec.stream_id, spec.resume_token).source_langs == spec.source_langs
    listed = start(source_langs=["ES", "de", "es"])  # source_langs alone means auto; duplicates dropped
    assert listed.source_langs == ["es", "de"] and listed.source_lang == "es"
    given = start(source_lang="es")  # a given language is as before: nothing detected
    assert given.source_langs == [] and not given.detects and given.source_lang == "es"


@pytest.mark.parametrize("msg,error", [
    ({"source_lang": "auto", "source_langs": ["en", "fr"]}, UnsupportedPair),  # fr has no route here
    ({"source_lang": "es", "source_langs": ["en", "es"]}, InvalidParameter),  # a given language is not detected
    ({"source_lang": "auto", "source_langs": []}, InvalidParameter),
    ({"source_lang": "auto", "source_langs": ["en"] * 9}, InvalidParameter),
    ({"source_lang": "auto", "source_langs": "en"}, InvalidParameter),
    ({"source_lang": "auto", "room": True}, InvalidParameter),  # a room's stream gives its language
    ({"source_lang": "auto", "target_langs": ["ja"]}, UnsupportedPair),  # no candidate reaches ja
])
def test_bad_auto_start_messages_are_refused_typed(msg: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        start(**msg)


def test_admission_reserves_the_detection_and_each_candidate_s_whole_rate() -> None:
    given = {str(k): v for k, v in stream_demand("s", "standard", "en", ["es"], False, 1.0, ["audio"]).rate.items()}
    auto = {str(k): v for k, v in stream_demand("s", "standard", "en", ["es"], False, 1.0, ["audio"],
                                                ["en", "es", "de"]).rate.items()}
    assert given == {"asr:tiny.en": 0.3, "mt:en-es": 0.3}
    assert auto == {"asr:tiny.en": 0.3, "asr:base:es": 0.3, "asr:base:de": 0.3, "asr:base:auto": 0.3,
                    "mt:en-es": 0.3, "mt:de-es": 0.3}  # es -> es is the transcript itself
    assert ModelKey.parse(str(ModelKey.detect())) == ModelKey.detect()


def loud(seconds: float) -> bytes:
    """PCM16: ``seconds`` of loud tone (speech to the fake VAD) and a second of silence (the utterance ends)."""
    tone = (0.5 * np.sin(np.arange(int(seconds * 16000)) * 0.3) * 32767).astype("<i2")
    return np.r_[tone, np.zeros(16000, dtype="<i2")].astype("<i2").tobytes()


# the fake detector tells utterances apart by their length: 1 s Spanish, 2 s German, 3 s unclear
SCORES = {1: {"en": 0.05, "es": 0.9, "de": 0.05}, 2: {"en": 0.1, "es": 0.1, "de": 0.8},
          3: {"en": 0.35, "es": 0.4, "de": 0.25}}
HEARD = {"es": "hola a todos", "de": "guten morgen", "en": "hello there"}


def answer(key: ModelKey, payload: Any) -> Any:
    if isinstance(payload, DetectInput):
        assert key == ModelKey.detect() and payload.candidates == ("en", "es", "de")
        # the tone's seconds: |0.5 sin| is over 0.05 on 94% of its samples, the silence around it on none
        return SCORES[round(float(np.sum(np.abs(payload.audio) > 0.05)) / 16000 / 0.94)]
    if isinstance(payload, AsrInput):
        return AsrOutput(HEARD[key.source], 0.9)
    return None


async def test_each_utterance_is_transcribed_and_translated_in_the_language_detected() -> None:
    port = FakePort(on_call=answer)
    s = session(port, FakeOwner(), spec=start(source_lang="auto", target_langs=["en", "es"], partials=False))
    ready = s.start().to_wire()
    assert ready["source_lang"] == "auto" and ready["source_langs"] == ["en", "es", "de"]
    for seconds in (1.0, 2.0, 3.0):
        await s.feed_audio(loud(seconds), None)
    await s.end()
    finals = [e for e in await drain(s) if e["type"] == "final"]
    assert [f["source_lang"] for f in finals] == ["es", "de", "de"]  # the unclear third keeps German
    es, de, unclear = finals
    assert es["source_text"] == "hola a todos" and es["translations"] == {"en": "HOLA A TODOS", "es": "hola a todos"}
    assert de["translations"] == {"en": "GUTEN MORGEN", "es": "GUTEN MORGEN"} and de["low_confidence"] == ["en"]
    assert "source_lang_unsure" not in es and es["source_lang_confidence"] == 0.9 and "detect" in es["latency_ms"]
    assert unclear["source_lang_unsure"] is True and unclear["source_lang_confidence"] == 0.25
    assert "language unsure: es scored 0.40" in unclear["note"]
    asr_keys = sorted(str(k) for k, p, _ in port.calls if isinstance(p, AsrInput))
    mt_keys = {str(k) for k, _, _ in port.calls if k.task == "mt"}
    assert asr_keys == ["asr:base:de", "asr:base:de", "asr:base:es"]
    assert mt_keys == {"mt:es-en", "mt:de-en", "mt:de-es"}


async def test_a_failed_detection_keeps_the_stream_s_language_and_says_so() -> None:
    from lingua_fusion.errors import BackendFailed

    def broken(key: ModelKey, payload: Any) -> Any:
        if isinstance(payload, DetectInput):
            raise BackendFailed("detector down")
        return answer(key, payload)

    s = session(FakePort(on_call=broken), FakeOwner(), spec=start(source_lang="auto", partials=False))
    s.start()
    await s.feed_audio(loud(1.0), None)
    await s.end()
    (final,) = [e for e in await drain(s) if e["type"] == "final"]
    assert final["source_lang"] == "en" and final["source_lang_unsure"] is True
    assert final["text"] == "hello there" and "language detection failed" in final["note"]


async def test_text_in_an_auto_stream_is_read_in_its_own_language() -> None:
    s = session(FakePort(on_call=answer), FakeOwner(),
                spec=start(source_lang="auto", target_langs=["en"], inputs=["text"]))
    s.start()
    await s.feed_text("Buenos días a todos, la reunión empieza a las diez de la mañana.")
    await s.end()
    (final,) = [e for e in await drain(s) if e["type"] == "final"]
    assert final["source_lang"] == "es" and final["modalities"] == ["text"]


def test_a_detection_crosses_to_the_model_process_and_its_output_is_checked() -> None:
    from lingua_fusion.errors import MalformedOutput
    from lingua_fusion.serving.shard import codec
    from lingua_fusion.serving.threads import check_outputs

    item = DetectInput(np.arange(8, dtype=np.float32), ("en", "es"))
    back = codec.decode(codec.encode({"op": "run", "payload": item, "value": {"en": 0.25, "es": 0.75}})[4:])
    assert back["payload"].candidates == ("en", "es") and np.array_equal(back["payload"].audio, item.audio)
    assert back["value"] == {"en": 0.25, "es": 0.75}
    assert check_outputs(ModelKey.detect(), [item], [{"en": 0.25, "es": 0.75}])
    for bad in ({"en": 1.0}, {"en": 0.5, "es": float("nan")}, AsrOutput("hola", 0.9)):  # a candidate missing,
        with pytest.raises(MalformedOutput):  # a probability that is none, a transcript
            check_outputs(ModelKey.detect(), [item], [bad])
