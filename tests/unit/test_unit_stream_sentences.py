"""A stream's caption cut at the maximum utterance length waits for the next one to finish its sentence
(stream/finals.py: the decision, pure; the emitter on fakes of the ports: no models)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fakes import FakePort, drain, session

from lingua_fusion.errors import Overloaded
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrOutput, MtInput
from lingua_fusion.stream import protocol
from lingua_fusion.stream.events import Final
from lingua_fusion.stream.finals import Heard, joins, open_note, share, waits
from lingua_fusion.stream.policy import SR, WINDOW, CommitPolicy, PolicyConfig
from lingua_fusion.stream.protocol import StreamSpec

CUT = "When you see your sister please ask her to bring these"
REST = "things with her from the store."


# ---- the decision ----------------------------------------------------------------------------------------------
def test_only_a_length_cut_with_words_waits_and_for_one_more_caption_at_most() -> None:
    assert waits([Heard(CUT, "length")])
    assert waits([Heard(CUT + ".", "length")])  # Whisper often puts a full stop at the cut: the next one decides
    assert not waits([Heard(CUT, "pause")]) and not waits([Heard(CUT, "end")])  # the speaker stopped
    assert not waits([Heard("", "length")])  # nothing heard
    assert not waits([Heard(CUT, "length", speech=False)])
    assert not waits([Heard(CUT, "length"), Heard(REST, "length")])  # one more utterance, then no longer


def test_the_next_caption_joins_when_it_goes_on_with_the_sentence() -> None:
    assert joins([Heard(CUT, "length")], Heard(REST))  # no final punctuation before it
    assert joins([Heard(CUT + ".", "length")], Heard("things with her."))  # Whisper's full stop at the cut
    assert not joins([Heard("Bring these things.", "length")], Heard("The store is near."))  # a new sentence
    assert not joins([Heard(CUT, "length")], Heard(""))  # nothing said
    assert not joins([Heard(CUT, "length")], Heard(REST, speech=False))  # a text message is not its end


def test_a_sentence_left_open_says_why_and_a_finished_one_says_nothing() -> None:
    assert open_note([Heard(CUT, "length")], "the stream ended") == (
        "cut at the maximum utterance length mid-sentence, and translated before the sentence ended: the stream "
        "ended")
    assert open_note([Heard(CUT, "length"), Heard(REST)], "x") is None


def test_one_translation_is_cut_back_onto_the_captions_it_was_made_from() -> None:
    a = Final(start=0.0, end=6.0, source_text=CUT, text="", translations={}, confidence=0.9)
    b = Final(start=6.0, end=8.0, source_text=REST, text="B", translations={"es": "B", "zh": "B"}, confidence=0.8,
              untranslated={"es": ["zz"]}, note="zz left")
    whole = Final(start=0.0, end=8.0, source_text=f"{CUT} {REST}", confidence=0.8, text="uno dos tres cuatro gazebo",
                  translations={"es": "uno dos tres cuatro gazebo", "zh": "一二三四五六"},
                  untranslated={"es": ["gazebo"]}, note="gazebo left", latency_ms={"mt": 12.0})
    share([a, b], whole)
    assert " ".join([a.translations["es"], b.translations["es"]]) == whole.translations["es"]
    assert a.translations["zh"] + b.translations["zh"] == whole.translations["zh"]  # CJK: cut between characters
    assert a.text == a.translations["es"] and b.text == b.translations["es"]  # the first target
    assert len(a.translations["es"]) > len(b.translations["es"])  # by each one's share of the source
    assert b.untranslated == {"es": ["gazebo"]} and a.untranslated is None  # the word with the piece holding it
    assert a.note == b.note == "gazebo left" and a.latency_ms["mt"] == b.latency_ms["mt"] == 12.0


# ---- the policy says why it cut ------------------------------------------------------------------------------------
def test_a_commit_says_whether_the_pause_or_the_length_limit_cut_it() -> None:
    p = CommitPolicy(PolicyConfig(max_utterance_s=2.0, eou_silence_s=0.3))
    w = WINDOW / SR
    cuts = [d.cut for d in p.on_vad(np.full(int(2.5 / w), 0.9), 2.5) if d.kind == "commit"]
    cuts += [d.cut for d in p.on_vad(np.zeros(int(0.5 / w)), 3.0) if d.kind == "commit"]
    assert cuts == ["length", "pause"]
    p.on_vad(np.full(int(1 / w), 0.9), 4.5)
    assert p.flush(4.5).cut == "end"


# ---- the emitter holds a cut caption for the next one ----------------------------------------------------------
def _port(texts: list[str]) -> FakePort:
    """ASR says ``texts`` in turn (one a committed utterance); MT upper-cases, as FakePort does."""
    said = iter(texts)

    def asr(key: ModelKey, payload: object) -> AsrOutput | None:
        return AsrOutput(next(said, ""), 0.9) if key.task == "asr" else None
    return FakePort(on_call=asr)


def _speech(seconds: float) -> bytes:
    return (np.full(int(seconds * SR), 0.5) * 32767).astype("<i2").tobytes()


def _silence(seconds: float) -> bytes:
    return np.zeros(int(seconds * SR), dtype="<i2").tobytes()


@pytest.fixture
def short_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Utterances cut at 2 s, a held caption waits 1 s at most."""
    monkeypatch.setitem(protocol.POLICIES, "standard", PolicyConfig(max_utterance_s=2.0, eou_silence_s=0.3,
                                                                    sentence_hold_s=1.0))


def _mt_inputs(port: FakePort) -> list[str]:
    return [p.text for k, p, _ in port.calls if k.task == "mt" and isinstance(p, MtInput)]


@pytest.mark.usefixtures("short_policy")
async def test_a_sentence_cut_by_the_length_limit_is_translated_whole() -> None:
    port = _port([CUT, REST])
    s = session(port, spec=StreamSpec(source_lang="en", targets=["es"], partials=False))
    s.start()
    await s.feed_audio(_speech(3.0) + _silence(1.0))  # cut at 2 s by length, then at the pause
    await s.end()
    finals = [e for e in await drain(s) if e["type"] == "final"]
    assert [f["source_text"] for f in finals] == [CUT, REST]  # the words, where they were said
    assert " ".join(f["text"] for f in finals) == f"{CUT} {REST}".upper()  # MT saw the sentence ...
    assert f"{CUT} {REST}" in _mt_inputs(port) and CUT not in _mt_inputs(port)  # ... never the piece alone
    assert [f["sentence"] for f in finals] == [[1, 2], [1, 2]] and "note" not in finals[0]
    assert finals[0]["latency_ms"]["held"] > 0


@pytest.mark.usefixtures("short_policy")
async def test_a_held_caption_waits_no_longer_than_the_hold_and_says_its_sentence_was_left_open() -> None:
    port = _port([CUT, REST])
    s = session(port, spec=StreamSpec(source_lang="en", targets=["es"], partials=False))
    s.start()
    await s.feed_audio(_speech(2.1))  # cut by length at 2 s; then nothing more comes for a while
    first = await asyncio.wait_for(s.events.get(), timeout=5)
    assert isinstance(first, Final) and first.text == CUT.upper()  # translated alone after the hold ...
    assert first.note is not None and "no more speech came within 1 s" in first.note  # ... and said
    await s.end()
    await drain(s)


@pytest.mark.usefixtures("short_policy")
async def test_the_end_of_the_stream_releases_a_held_caption_at_once() -> None:
    port = _port([CUT])
    s = session(port, spec=StreamSpec(source_lang="en", targets=["es"], partials=False))
    s.start()
    await s.feed_audio(_speech(2.1))
    await asyncio.sleep(0.1)
    await s.end()
    finals = [e for e in await drain(s, wait_s=0.9) if e["type"] == "final"]  # sooner than the 1 s hold
    # the flush committed the speech after the cut (nothing said in it here), then the stream ended
    assert [f["text"] for f in finals] == [CUT.upper()]
    assert "translated before the sentence ended" in finals[0]["note"]


@pytest.mark.usefixtures("short_policy")
async def test_a_drain_releases_a_held_caption() -> None:
    s = session(_port([CUT]), spec=StreamSpec(source_lang="en", targets=["es"], partials=False))
    s.start()
    await s.feed_audio(_speech(2.1))
    for _ in range(50):
        if s.finals.holding:
            break
        await asyncio.sleep(0.01)
    assert s.finals.holding and s.busy()  # a drain waits for it ...
    s.release_held()  # ... and lets it go
    first = await asyncio.wait_for(s.events.get(), timeout=0.9)
    assert isinstance(first, Final) and first.note is not None and "draining" in first.note
    await s.end()
    await drain(s)


@pytest.mark.usefixtures("short_policy")
async def test_a_held_sentence_whose_translation_fails_still_goes_out_numbered_with_its_words() -> None:
    said = iter([CUT, REST])

    def answer(key: ModelKey, payload: object) -> AsrOutput | None:
        if key.task == "mt" and isinstance(payload, MtInput) and payload.text.startswith(CUT):
            raise Overloaded("full")  # the joined sentence's MT
        return AsrOutput(next(said, ""), 0.9) if key.task == "asr" else None
    s = session(FakePort(on_call=answer), spec=StreamSpec(source_lang="en", targets=["es"], partials=False))
    s.start()
    await s.feed_audio(_speech(3.0) + _silence(1.0))
    await s.end()
    finals = [e for e in await drain(s) if e["type"] == "final"]
    assert [(f["seq"], f["source_text"], f["failed"]) for f in finals] == [(1, CUT, ["mt:es"]), (2, REST, ["mt:es"])]
    assert "translation failed" in finals[0]["note"]
