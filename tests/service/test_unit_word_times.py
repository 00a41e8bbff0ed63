"""Timed words stay true to the text users see (models/word_times.py): a loop cut by the transcript guard, a slide
term corrected, a piece's words moved onto the file's clock, and words crossing to the model process intact; karaoke
WebVTT cues; the torch port, which cannot time words, refuses them before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingua_fusion.config import Settings
from lingua_fusion.errors import NotConfigured
from lingua_fusion.files import FileRequest, FileTranslator
from lingua_fusion.files.captions import to_vtt
from lingua_fusion.models.base import ASRResult, ASRSegment, ASRWord
from lingua_fusion.models.transcript_guard import guard_segments
from lingua_fusion.models.word_times import realigned, shifted
from lingua_fusion.serving.shard import codec
from lingua_fusion.types import Segment, Word
from lingua_fusion.video.context import correct_terms


def timed(text: str, start: float = 0.0, step: float = 0.5) -> list[ASRWord]:
    return [ASRWord(w, round(start + i * step, 3), round(start + (i + 1) * step, 3), 0.9)
            for i, w in enumerate(text.split())]


def test_unchanged_text_keeps_every_word_and_time() -> None:
    words = timed("Good morning, everyone.")
    assert realigned(words, "Good morning, everyone.") == words


def test_a_cut_loop_drops_the_repeated_words_and_keeps_the_rest_in_time() -> None:
    loop = "na " * 12
    seg = ASRSegment(0.0, 10.0, "Hello " + loop.strip(), 0.8, timed("Hello " + loop))
    (out,), warnings = guard_segments([seg], None)
    assert warnings, "the loop is reported"
    assert [w.word for w in out.words] == out.text.split()
    assert out.words[0] == seg.words[0]
    assert all(a.end <= b.start for a, b in zip(out.words, out.words[1:], strict=False))


def test_a_corrected_slide_term_takes_the_time_of_the_words_it_replaces() -> None:
    plain = [ASRSegment(0.0, 3.0, "We use cube an eighties today.", 0.9, timed("We use cube an eighties today."))]
    (fixed,) = correct_terms(plain, "We use Kubernetes today.", {"kubernetes"})
    assert fixed.text == "We use Kubernetes today."
    assert [w.word for w in fixed.words] == ["We", "use", "Kubernetes", "today."]
    kube = fixed.words[2]
    assert (kube.start, kube.end) == (1.0, 2.5)  # the span of "cube an eighties"
    assert fixed.words[3] == plain[0].words[5]


def test_segments_whose_words_were_not_asked_for_get_none_when_corrected() -> None:
    plain = [ASRSegment(0.0, 3.0, "We use cube an eighties today.", 0.9)]
    assert correct_terms(plain, "We use Kubernetes today.", {"kubernetes"})[0].words == []


def test_a_pieces_words_move_onto_the_files_clock() -> None:
    assert [(w.start, w.end) for w in shifted(timed("one two"), 25.5)] == [(25.5, 26.0), (26.0, 26.5)]


def test_words_cross_the_model_process_wire() -> None:
    res = ASRResult("one two", "en", [ASRSegment(0.0, 1.0, "one two", 0.9, timed("one two"))], 0.99)
    back = codec.decode(codec.encode({"op": "ok", "value": res})[4:])["value"]
    assert back == res
    assert isinstance(back.segments[0].words[0], ASRWord)


def test_karaoke_vtt_times_each_spoken_word_over_the_translation() -> None:
    seg = Segment(start=1.0, end=2.0, source_text="Good morning.", text="Buenos días.",
                  words=[Word(word="Good", start=0.98, end=1.3, probability=0.9),
                         Word(word="morning.", start=1.3, end=1.9, probability=0.9)])
    assert to_vtt([seg], karaoke=True) == ("WEBVTT\n\n00:00:01.000 --> 00:00:02.000\n"
                                           "Good <00:00:01.300>morning.\nBuenos días.\n")
    same = seg.model_copy(update={"text": seg.source_text})  # a transcription: one line
    assert to_vtt([same], karaoke=True).endswith("00:00:02.000\nGood <00:00:01.300>morning.\n")
    assert to_vtt([seg]) == "WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nBuenos días.\n"  # not asked: as before


def test_word_times_on_the_torch_port_are_refused_before_any_work(tmp_path: Path) -> None:
    from conftest import silence_wav

    settings = Settings()
    settings.state_dir = tmp_path
    settings.models.backend = "torch"
    translator = FileTranslator(settings)
    try:
        with pytest.raises(NotConfigured) as exc:
            translator.validate(FileRequest(source_modality="audio", target_lang="es", source_lang="en",
                                            data=silence_wav(1.0), word_timestamps=True))
        assert exc.value.status == 501 and exc.value.details["field"] == "word_timestamps"
        assert "ctranslate2" in exc.value.message
    finally:
        translator.close()
