"""Diarization's pure parts, without models: the speaker clusterer, the DER metric, speaker captions, the text
split at a change of speaker, MT sentences that stop at one, and the request checks (tests/e2e/test_diarize.py runs
the real encoder through the CLI, the REST API and the OpenAI route)."""

from __future__ import annotations

import numpy as np
import pytest

from lingua_fusion.config import Settings
from lingua_fusion.errors import InvalidParameter
from lingua_fusion.files import FileRequest
from lingua_fusion.files.captions import to_srt, to_vtt
from lingua_fusion.files.diarize import Part, parts_of, split_by_speaker, split_text
from lingua_fusion.files.sentences import sentence_groups
from lingua_fusion.files.validate import RequestValidator
from lingua_fusion.lab.diarize.der import Span, score
from lingua_fusion.models.registry import Registry
from lingua_fusion.speakers.cluster import Assignment, SpeakerClusterer, label_all
from lingua_fusion.types import Segment, Word

pytestmark = pytest.mark.timeout(60)
RNG = np.random.default_rng(7)


def voice(direction: np.ndarray, noise: float = 0.15) -> np.ndarray:
    return direction + noise * RNG.standard_normal(direction.shape)


def test_two_voices_get_two_labels_in_order_of_appearance() -> None:
    a, b = np.eye(16)[0], np.eye(16)[1]
    order = [b, b, a, b, a, a]
    found = label_all([voice(v) for v in order], [2.0] * 6, threshold=0.7)
    assert [f.label for f in found if f is not None] == ["S1", "S1", "S2", "S1", "S2", "S2"]
    assert all(f is not None and f.confidence > 0.9 for f in found)


def test_silence_is_nobodys_and_a_close_voice_joins() -> None:
    c = SpeakerClusterer(threshold=0.8)
    assert c.assign(np.zeros(8)) is None
    first = c.assign(np.eye(8)[0])
    again = c.assign(np.eye(8)[0] + 0.1 * np.eye(8)[1])
    assert first is not None and first.new and again is not None and again.index == 0 and not again.new
    assert c.speakers == 1


def test_the_speaker_cap_holds_and_says_it_is_unsure() -> None:
    c = SpeakerClusterer(threshold=0.8, max_speakers=2)
    for i in range(3):
        c.assign(np.eye(8)[i])
    third = c.assign(np.eye(8)[2])
    assert c.speakers == 2 and third is not None and third.confidence < 0.6


def test_short_stretches_may_join_at_a_lower_bar() -> None:
    c = SpeakerClusterer(threshold=0.8, slack=0.25)
    assert c.bar(1.6) == pytest.approx(0.8) and c.bar(0.4) < 0.65 and c.bar(3.0) == pytest.approx(0.8)


def test_bad_clusterer_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        SpeakerClusterer(max_speakers=0)
    with pytest.raises(ValueError):
        SpeakerClusterer(threshold=1.5)


def test_der_is_zero_for_a_perfect_labelling_whatever_its_names() -> None:
    ref = [Span("joe", 0.0, 2.0), Span("amy", 2.5, 4.0)]
    s = score(ref, [Span("S2", 0.0, 2.0), Span("S1", 2.5, 4.0)])
    assert s.der == pytest.approx(0.0, abs=0.01) and s.agreement == pytest.approx(1.0)
    assert s.mapping == {"S2": "joe", "S1": "amy"}


def test_der_counts_missed_false_alarm_and_confusion() -> None:
    ref = [Span("joe", 0.0, 2.0), Span("amy", 2.0, 4.0)]
    one = score(ref, [Span("S1", 0.0, 4.0)])  # one speaker for both: half the speech confused
    assert one.confusion == pytest.approx(2.0, abs=0.02) and one.der == pytest.approx(0.5, abs=0.01)
    assert one.agreement == pytest.approx(0.5, abs=0.01)
    gaps = score(ref, [Span("S1", 0.0, 1.0), Span("S2", 2.0, 5.0)])
    assert gaps.missed == pytest.approx(1.0, abs=0.02) and gaps.false_alarm == pytest.approx(1.0, abs=0.02)
    collared = score(ref, [Span("S1", 0.0, 2.2), Span("S2", 2.2, 4.0)], collar=0.25)
    assert collared.der == pytest.approx(0.0, abs=0.01)


def test_captions_name_the_speaker() -> None:
    segs = [Segment(start=0.0, end=1.5, source_text="Hi.", text="Hola.", speaker="S1"),
            Segment(start=1.6, end=3.0, source_text="Yes <no>.", text="Sí <no>.", speaker="S2"),
            Segment(start=3.1, end=4.0, source_text="Ok.", text="Vale.")]
    vtt, srt = to_vtt(segs), to_srt(segs)
    assert "<v S1>Hola.\n" in vtt and "<v S2>Sí &lt;no>.\n" in vtt and "\nVale.\n" in vtt
    assert "\nS1: Hola.\n" in srt and "\nS2: Sí <no>.\n" in srt and "\nVale.\n" in srt


def test_karaoke_captions_name_the_speaker_too() -> None:
    seg = Segment(start=0.0, end=1.0, source_text="Hi there.", text="Hola.", speaker="S2",
                  words=[Word(word="Hi", start=0.0, end=0.4, probability=0.9),
                         Word(word="there.", start=0.5, end=1.0, probability=0.9)])
    assert "\n<v S2>Hi <00:00:00.500>there.\n<v S2>Hola.\n" in to_vtt([seg], karaoke=True)


def test_a_segment_of_two_speakers_is_split_at_a_clause_end() -> None:
    assert split_text("Yes, sure. Why not today?", [1.0, 1.0]) == ["Yes, sure.", "Why not today?"]
    pieces = split_text("one two three four five six", [1.0, 2.0])
    assert " ".join(pieces) == "one two three four five six" and len(pieces) == 2


def test_a_split_segment_with_word_times_splits_at_the_words_and_keeps_each_its_own() -> None:
    # asked with word_timestamps: the words say where the text changes hands (not the share of time), and each
    # half keeps only its own words, so the words still spell each half's text
    spoken = [("Are", 0.0, 0.3), ("you", 0.3, 0.5), ("coming?", 0.5, 1.0), ("Yes,", 1.6, 1.9),
              ("in", 1.9, 2.0), ("a", 2.0, 2.1), ("minute.", 2.1, 2.8)]
    seg = Segment(start=0.0, end=2.8, source_text="Are you coming? Yes, in a minute.",
                  text="Are you coming? Yes, in a minute.",
                  words=[Word(word=w, start=a, end=b, probability=0.9) for w, a, b in spoken])
    one, two = Assignment(0, 0.9, 0.9), Assignment(1, 0.8, 0.85)
    parts = [(Part(0, 0, 16000), one), (Part(0, int(1.5 * 16000), int(2.8 * 16000)), two)]
    first, second = split_by_speaker(seg, parts)
    assert (first.speaker, first.source_text, second.speaker, second.source_text) == \
        ("S1", "Are you coming?", "S2", "Yes, in a minute.")
    assert [w.word for w in first.words or []] == ["Are", "you", "coming?"]
    assert [w.word for w in second.words or []] == ["Yes,", "in", "a", "minute."]
    assert first.end == second.start == 1.25


def test_pauses_cut_a_segment_into_parts() -> None:
    tone = 0.3 * np.sin(np.arange(8000) / 5.0).astype(np.float32)
    audio = np.concatenate([tone, np.zeros(8000, np.float32), tone])  # 0.5 s voice, 0.5 s pause, 0.5 s voice
    parts = parts_of(audio)
    assert len(parts) == 2 and parts[0][1] <= 8000 + 480 and parts[1][0] >= 16000 - 480


def test_mt_sentences_stop_at_a_change_of_speaker() -> None:
    segs = [Segment(start=0.0, end=1.0, source_text="so we", text="", speaker="S1"),
            Segment(start=1.1, end=2.0, source_text="agree then", text="", speaker="S2"),
            Segment(start=2.1, end=3.0, source_text="and go.", text="", speaker="S2")]
    assert sentence_groups(segs) == [[0], [1, 2]]


@pytest.mark.parametrize(("req", "field"), [
    (FileRequest(source_modality=None, target_lang="es", text="Hello there.", source_lang="en", diarize=True),
     "diarize"),
    (FileRequest(source_modality="audio", target_lang="es", data=b"RIFF", diarize=True, max_speakers=0),
     "max_speakers"),
    (FileRequest(source_modality="audio", target_lang="es", data=b"RIFF", diarize=True, max_speakers=99),
     "max_speakers"),
    (FileRequest(source_modality="audio", target_lang="es", data=b"RIFF", max_speakers=2), "max_speakers"),
])
def test_bad_diarize_requests_are_refused_before_any_work(req: FileRequest, field: str) -> None:
    settings = Settings()
    with pytest.raises(InvalidParameter) as exc:
        RequestValidator(settings, Registry(settings)).validate(req)
    assert exc.value.details["field"] == field and exc.value.status == 400
