"""Speakers on live streams and rooms (issue 32), with the real voice encoder, Whisper and Apertium on a real server
and real WebSockets: a dialogue of two synthetic voices taking turns (Piper's joe, espeak-ng's en+f3) gives each
voice one stable label on the finals; the publisher names a speaker and a room's listeners, live and late, see the
name; bad values are typed errors. The pure parts (option parsing, the snapshot's speakers, the room history's
names) are tested without models below."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import serve_in_loop
from websockets.asyncio.client import connect

from lingua_fusion.config import DiarizeSettings, Settings
from lingua_fusion.errors import InvalidParameter
from lingua_fusion.lab.diarize.dialogue import Dialogue, build
from lingua_fusion.media import decode_audio
from lingua_fusion.rooms.bus import LocalRoomBus
from lingua_fusion.speakers.cluster import SpeakerClusterer
from lingua_fusion.state.streams import SQLiteStreamStore
from lingua_fusion.stream.events import Final
from lingua_fusion.stream.finals import Heard, joins
from lingua_fusion.stream.speakers import StreamSpeakers, Voice, parse_diarize

WAIT_S = 90.0  # a wait for something that must happen, never a speed bound
TURNS = [("joe", "Good morning, did you bring the slides for the meeting?"),
         ("en+f3", "Yes, they are on my laptop, ready to show."),
         ("joe", "Great, then we can start in five minutes."),
         ("en+f3", "Perfect, I will call the others now.")]


def pcm_of(d: Dialogue, start_s: float, end_s: float) -> bytes:
    audio, _ = decode_audio(d.wav, Settings().limits)
    part = audio[int(start_s * 16000):int(end_s * 16000)]
    return (np.clip(part, -1, 1) * 32767).astype("<i2").tobytes()


def turn_of(final: dict[str, Any], d: Dialogue) -> int:
    """The turn a final covers (most overlap)."""
    return max(range(len(d.turns)), key=lambda i: min(final["end"], d.turns[i].end) - max(final["start"],
                                                                                            d.turns[i].start))


async def read_all(ws: Any, into: list[dict[str, Any]]) -> None:
    with contextlib.suppress(Exception):
        async for m in ws:
            into.append(json.loads(m))


async def until(got: list[dict[str, Any]], kind: str, n: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while sum(e["type"] == kind for e in got) < n:  # noqa: ASYNC110 (the reader task appends, no event)
            await asyncio.sleep(0.05)


def settings(tmp_path: Path) -> Settings:
    s = Settings(state_dir=tmp_path)
    s.server.auth = False
    return s


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_two_voices_taking_turns_get_two_stable_labels_and_a_room_sees_the_rename(tmp_path: Path) -> None:
    d = await asyncio.to_thread(build, TURNS, 1.2)
    cut = d.turns[1].end + 0.6  # in the pause after the second turn: the publisher names S1 there
    async with serve_in_loop(settings(tmp_path), WAIT_S) as (host, _app):
        pub = await connect(f"ws://{host}/v1/streams", max_size=16 * 2**20)
        await pub.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "partials": False,
                                   "inputs": ["audio"], "diarize": True, "room": True}))
        ready = json.loads(await asyncio.wait_for(pub.recv(), WAIT_S))
        assert ready["type"] == "ready" and ready["max_speakers"] == 8, ready
        listen = f"ws://{host}/v1/rooms/{ready['room_id']}/listen?targets=es&token={ready['listener_token']}"
        live = await connect(listen)
        got: list[dict[str, Any]] = []
        heard: list[dict[str, Any]] = []
        tasks = [asyncio.create_task(read_all(pub, got)), asyncio.create_task(read_all(live, heard))]
        first, rest = pcm_of(d, 0.0, cut), pcm_of(d, cut, d.duration + 1.0)
        for i in range(0, len(first), 32000):  # 1 s messages, as a live client sends them
            await pub.send(first[i:i + 32000])
        await until(got, "final", 2)
        await pub.send(json.dumps({"type": "rename_speaker", "speaker": "S1", "name": "Dr. Chen"}))
        await until(got, "speaker_renamed", 1)
        for i in range(0, len(rest), 32000):
            await pub.send(rest[i:i + 32000])
        await pub.send(json.dumps({"type": "end"}))
        async with asyncio.timeout(WAIT_S):
            await asyncio.gather(*tasks)
        late: list[dict[str, Any]] = []  # joins the ended room: its history, names first
        await read_all(await connect(listen), late)

    finals = [e for e in got if e["type"] == "final"]
    voice = {turn_of(f, d): f["speaker"] for f in finals}
    assert sorted(voice) == [0, 1, 2, 3], [(f["start"], f["source_text"]) for f in finals]
    assert voice[0] == voice[2] == "S1" and voice[1] == voice[3] == "S2", voice  # named as they appear, stable
    assert all(0.5 <= f["speaker_confidence"] <= 1 and f["latency_ms"]["speaker"] > 0 for f in finals), finals
    print("speaker embedding ms:", [f["latency_ms"]["speaker"] for f in finals], "asr ms:",
          [f["latency_ms"]["asr"] for f in finals], "confidence:", [f["speaker_confidence"] for f in finals])
    renamed = next(e for e in got if e["type"] == "speaker_renamed")
    assert renamed == {"type": "speaker_renamed", "speaker": "S1", "name": "Dr. Chen", "names": {"S1": "Dr. Chen"}}
    named = [(f["speaker"], f.get("speaker_name")) for f in finals]
    assert named[:2] == [("S1", None), ("S2", None)] and named[2:] == [("S1", "Dr. Chen"), ("S2", None)], named
    # the room's listener: every final with its speaker, the rename in its place, the name on later finals
    kinds = [e["type"] for e in heard if e["type"] in ("final", "speaker_renamed")]
    assert kinds == ["final", "final", "speaker_renamed", "final", "final"], kinds
    assert [(f["speaker"], f.get("speaker_name")) for f in heard if f["type"] == "final"] == named
    # a late listener gets the current names first, then the finals
    assert late[0]["type"] == "speaker_renamed" and late[0]["names"] == {"S1": "Dr. Chen"}, late[:2]
    assert [f["speaker"] for f in late if f["type"] == "final"] == [s for s, _n in named]


@pytest.mark.timeout(120)
async def test_bad_diarize_values_are_typed_errors(tmp_path: Path) -> None:
    async with serve_in_loop(settings(tmp_path), WAIT_S) as (host, _app):
        async def start(**kw: Any) -> tuple[dict[str, Any], Any]:
            ws = await connect(f"ws://{host}/v1/streams")
            await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"],
                                      "inputs": ["audio", "text"], **kw}))
            return json.loads(await asyncio.wait_for(ws.recv(), WAIT_S)), ws

        for kw, field in [({"diarize": "yes"}, "diarize"), ({"diarize": 1}, "diarize"),
                          ({"diarize": True, "max_speakers": 0}, "max_speakers"),
                          ({"diarize": True, "max_speakers": 9}, "max_speakers"),  # over diarize.max_speakers
                          ({"diarize": True, "max_speakers": 2.5}, "max_speakers"),
                          ({"max_speakers": 2}, "max_speakers"),  # without diarize
                          ({"diarize": True, "inputs": ["text"]}, "diarize")]:  # no voice to tell apart
            ev, ws = await start(**kw)
            assert (ev["type"], ev["code"], ev["details"]["field"]) == ("error", "invalid_parameter", field), (kw, ev)
            await ws.wait_closed()
            assert ws.close_code == 4400
        ev, ws = await start()  # a stream that did not ask for speakers cannot name one; it goes on
        await ws.send(json.dumps({"type": "rename_speaker", "speaker": "S1", "name": "Ana"}))
        ev = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        assert (ev["code"], ev["details"]["field"]) == ("invalid_parameter", "diarize"), ev
        await ws.close()
        ev, ws = await start(diarize=True, max_speakers=2)
        assert ev["type"] == "ready" and ev["max_speakers"] == 2
        for speaker, name, field in [("S3", "Ana", "speaker"), ("speaker 1", "Ana", "speaker"),
                                     ("S1", 7, "name"), ("S1", "x" * 65, "name"), ("S1", "a\u200bb", "name")]:
            await ws.send(json.dumps({"type": "rename_speaker", "speaker": speaker, "name": name}))
            ev = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
            assert (ev["type"], ev["code"], ev["details"]["field"]) == ("error", "invalid_parameter", field), ev
        await ws.send(json.dumps({"type": "text", "text": "Still here."}))  # the stream went on
        while (ev := json.loads(await asyncio.wait_for(ws.recv(), WAIT_S)))["type"] != "final":
            pass
        assert ev["source_text"] == "Still here." and "speaker" not in ev  # typed text has no voice
        await ws.close()


# ---- the pure parts -----------------------------------------------------------------------------------------------
def test_parse_diarize() -> None:
    assert parse_diarize({}, 8) == (False, 0)
    assert parse_diarize({"diarize": True}, 8) == (True, 8)
    assert parse_diarize({"diarize": True, "max_speakers": 3}, 8) == (True, 3)
    for bad in ({"diarize": "true"}, {"diarize": None}, {"diarize": True, "max_speakers": True},
                {"diarize": False, "max_speakers": 2}, {"diarize": True, "max_speakers": 9}):
        with pytest.raises(InvalidParameter):
            parse_diarize(bad, 8)


def unit(seed: int, base: np.ndarray | None = None, noise: float = 0.0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=256).astype(np.float32)
    v = v if base is None else base + noise * v
    return v / np.linalg.norm(v)


def final(voice: Voice) -> Final:
    return Final(start=0, end=1, source_text="words", text="", translations={}, confidence=1.0, voice=voice)


def test_the_speakers_in_a_snapshot_keep_labels_and_names_after_a_resume(tmp_path: Path) -> None:
    a, b = unit(1), unit(2)
    port: Any = None  # label, rename, state and restore use no model
    first = StreamSpeakers(port, 4, DiarizeSettings(), lambda _t: None)  # type: ignore[arg-type, return-value]
    labels = []
    for v in (a, b, unit(3, a, 0.05), unit(4, b, 0.05)):
        f = final(Voice(v, 2.0))
        first.label(f)
        labels.append(f.speaker)
    assert labels == ["S1", "S2", "S1", "S2"]
    first.rename("S2", "  Dr.   Chen ")
    store = SQLiteStreamStore(tmp_path)  # the snapshot a resume reads back
    store.open_stream("st_1", "tok", {"spec": {}})
    store.append_final("st_1", {"type": "final", "seq": 1, "end": 1.0}, 1.0, speakers=first.state())
    state = store.resume("st_1", "tok")["speakers"]
    store.close()
    assert len(json.dumps(state)) < 2000  # two speakers: about 0.7 KB each
    again = StreamSpeakers(port, 4, DiarizeSettings(), lambda _t: None)  # type: ignore[arg-type, return-value]
    again.restore(state)
    assert again.names == {"S2": "Dr. Chen"}
    f = final(Voice(unit(5, b, 0.05), 2.0))
    again.label(f)
    again.name(f)
    assert (f.speaker, f.speaker_name) == ("S2", "Dr. Chen") and f.voice is None
    broken = SpeakerClusterer()
    broken.restore({"dim": 256, "weights": [1.0], "sums": "not base64!"})  # a bad snapshot: labels start again
    assert broken.speakers == 0


def test_a_held_sentence_does_not_join_two_speakers() -> None:
    held = [Heard("and then we", cut="length", speaker="S1")]
    assert joins(held, Heard("went home.", speaker="S1"))
    assert not joins(held, Heard("went home.", speaker="S2"))


async def test_a_room_history_gives_the_latest_names_first_whatever_after_seq() -> None:
    bus = LocalRoomBus()
    await bus.publish("rm", {"type": "final", "seq": 1, "speaker": "S1"})
    await bus.publish("rm", {"type": "speaker_renamed", "speaker": "S1", "name": "A", "names": {"S1": "A"}})
    await bus.publish("rm", {"type": "final", "seq": 2, "speaker": "S1", "speaker_name": "A"})
    await bus.publish("rm", {"type": "speaker_renamed", "speaker": "S2", "name": "B", "names": {"S1": "A", "S2": "B"}})
    history = await bus.history("rm", 0)
    assert [e["type"] for e in history] == ["speaker_renamed", "final", "final"]
    assert history[0]["names"] == {"S1": "A", "S2": "B"}
    assert [e["type"] for e in await bus.history("rm", 5)] == ["speaker_renamed"]
