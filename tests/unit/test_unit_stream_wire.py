"""Each event's to_wire() has the keys its TypedDict declares (stream/events.py): every required key, no other,
in the order the wire always had (the type first, then the fields)."""

from __future__ import annotations

from typing import NotRequired, get_origin, get_type_hints

import pytest

from lingua_fusion.json_types import JSONValue
from lingua_fusion.stream import events as ev
from lingua_fusion.stream import wire

CASES = [
    (ev.Ready("st_1", "tok", "standard", "en", ["es"], True, resumed={"last_seq": 3, "resume_from": 1.5,
                                                                       "resume_from_ts": None}, room_id="rm_1"),
     wire.ReadyJSON),
    (ev.Partial(0.0, 1.0, "hi", "h", "hola", 0.9, 1), wire.PartialJSON),
    (ev.Revision(0.0, 1.0, "hi", "h", "hola", 0.9, 2), wire.PartialJSON),
    (ev.Final(0.0, 1.0, "hi", "hola", {"es": "hola"}, 0.9, seq=1, words=[wire.WordJSON(word="hi", start=0.0, end=1.0)],
              speaker="S1", voice=object()), wire.FinalJSON),
    (ev.SpeakerRenamed("S1", "Ana", {"S1": "Ana"}), wire.SpeakerRenamedJSON),
    (ev.Metrics(1, {"asr": 1.0}, {"mt": 0}), wire.MetricsJSON),
    (ev.Slide(1.0, "Title", text="Titulo", translations={"es": "Titulo"},
              lines=[{"source_text": "Title", "title": True, "translations": {"es": "Titulo"}}]), wire.SlideJSON),
    (ev.Sign(0.0, 1.0, "HELLO", 0.8, "hola", {"es": "hola"}), wire.SignJSON),
    (ev.Speech(1, "es", "UklGRg=="), wire.SpeechJSON),
    (ev.Error("bad", "no", {"field": "x"}), wire.ErrorJSON),
    (ev.NotDurable(3, "down"), wire.NotDurableJSON),
    (ev.Durable(3), wire.DurableJSON),
    (ev.Degraded("standard", 1, "no_partials", "asr", None), wire.DegradedJSON),
    (ev.Restored("standard", 0, "no_partials", "asr", 0.2), wire.DegradedJSON),
    (ev.Closed(3, unlogged=1, video={"frames": 1, "ocr_calls": 0, "superseded": 0}), wire.ClosedJSON),
]


@pytest.mark.parametrize(("event", "shape"), CASES, ids=[type(c[0]).__name__ for c in CASES])
def test_to_wire_has_the_keys_of_its_typeddict(event: ev.Event, shape: type) -> None:
    wire = event.to_wire()
    # NotRequired is seen here (the module's annotations are strings at run time); JSONValue names itself
    declared = get_type_hints(shape, localns={"JSONValue": JSONValue}, include_extras=True)
    required = {k for k, t in declared.items() if get_origin(t) is not NotRequired}
    assert set(wire) <= set(declared), set(wire) - set(declared)
    assert required <= set(wire), required - set(wire)
    assert next(iter(wire)) == "type" and wire["type"] == event.TYPE


def test_ready_of_a_resumed_stream_keeps_its_order() -> None:
    wire = CASES[0][0].to_wire()
    assert list(wire)[-4:] == ["resumed", "last_seq", "resume_from", "resume_from_ts"]
    assert wire["resumed"] is True and wire["last_seq"] == 3


def test_a_logged_final_is_sent_as_logged() -> None:
    body = ev.Final(0.0, 1.0, "hi", "hola", {"es": "hola"}, 0.9, seq=4).to_wire()
    sent = ev.Logged(body).to_wire()
    assert sent == body and sent is not body
