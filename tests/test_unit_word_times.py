"""Timed words stay true to the text users see (models/word_times.py): a loop cut by the transcript guard, a slide
term corrected, a piece's words moved onto the file's clock, and words crossing to the model process intact."""

from __future__ import annotations

from lingua_fusion.models.base import ASRResult, ASRSegment, ASRWord
from lingua_fusion.models.transcript_guard import guard_segments
from lingua_fusion.models.word_times import realigned, shifted
from lingua_fusion.serving.shard import codec
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


def test_a_pieces_words_move_onto_the_files_clock() -> None:
    assert [(w.start, w.end) for w in shifted(timed("one two"), 25.5)] == [(25.5, 26.0), (26.0, 26.5)]


def test_words_cross_the_model_process_wire() -> None:
    res = ASRResult("one two", "en", [ASRSegment(0.0, 1.0, "one two", 0.9, timed("one two"))], 0.99)
    back = codec.decode(codec.encode({"op": "ok", "value": res})[4:])["value"]
    assert back == res
    assert isinstance(back.segments[0].words[0], ASRWord)
