"""Never wrong without saying so, in the pure parts: sentences joined across Whisper's segments before MT, decoder
loops cut and marked, Mandarin written in the script asked for, Apertium's systematic slips fixed."""

from __future__ import annotations

import pytest

from lingua_fusion.files.sentences import join, sentence_groups, spread
from lingua_fusion.models.transcript_guard import check, script_for, to_script
from lingua_fusion.types import Segment


def seg(start: float, end: float, text: str) -> Segment:
    return Segment(start=start, end=end, source_text=text, text="")


def test_a_sentence_split_by_a_segment_boundary_is_one_group() -> None:
    segs = [seg(0, 3, "I will ask her to bring these"), seg(3.2, 5, "things with her from the store."),
            seg(5.4, 6, "Thank you."), seg(6.1, 8, "See you tomorrow.")]
    assert sentence_groups(segs) == [[0, 1], [2], [3]]


def test_a_full_stop_whisper_put_at_a_pause_does_not_end_a_sentence_that_goes_on_in_lower_case() -> None:
    segs = [seg(0, 3, "Ask her to bring these."), seg(3.2, 5, "things from the store.")]
    assert sentence_groups(segs) == [[0, 1]]
    assert join([s.source_text for s in segs], "en") == "Ask her to bring these things from the store."


def test_a_long_pause_or_the_length_cap_ends_a_group_without_punctuation() -> None:
    assert sentence_groups([seg(0, 2, "and then"), seg(5, 6, "nothing")]) == [[0], [1]]
    many = [seg(i, i + 0.9, "word " * 30) for i in range(10)]
    assert all(sum(len(many[i].source_text) for i in g) <= 800 for g in sentence_groups(many))


def test_the_translation_is_spread_back_between_words_in_proportion() -> None:
    pieces = spread("Le pediré que traiga estas cosas con ella de la tienda.", [29, 31], "es")
    assert pieces == ["Le pediré que traiga estas", "cosas con ella de la tienda."]
    assert " ".join(spread("uno dos tres cuatro cinco seis", [1, 1, 1], "es")) == "uno dos tres cuatro cinco seis"
    assert "".join(spread("我会请她从商店带这些东西来。", [10, 10], "zh")) == "我会请她从商店带这些东西来。"
    assert spread("solo", [5], "es") == ["solo"]


def test_a_character_loop_is_cut_and_marked() -> None:
    got = check("你好" + "天" * 300)
    assert got.suspect and got.text == "你好天" and "loop" in got.why
    assert check("la la la la la la la la la la la la").suspect


def test_text_that_compresses_too_well_is_marked_but_kept() -> None:
    text = "We will meet on Monday at nine. " * 6
    got = check(text)
    assert got.suspect and "compression ratio" in got.why


@pytest.mark.parametrize("text", ["We deploy on Kubernetes with Helm charts.", "今天天气很好，我们去公园散步吧。",
                                  "Cut emissions by half before 2030, and by 90 percent before 2050."])
def test_ordinary_speech_is_not_suspect(text: str) -> None:
    got = check(text)
    assert not got.suspect and got.text == text


def test_mandarin_is_written_in_the_script_asked_for() -> None:
    assert script_for("zh") == "Hans" and script_for("zh-TW") == "Hant" and script_for("en") is None
    assert to_script("天氣很好，請問哪裡", "Hans") == "天气很好，请问哪里"
    assert to_script("天气很好", "Hant") == "天氣很好"


# ---- Apertium, the real one ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def apertium():  # type: ignore[no-untyped-def]
    from lingua_fusion.models.mt_apertium import ApertiumMT

    mt = ApertiumMT()
    yield mt
    mt.close()


def test_on_before_a_topic_is_sobre_not_encima(apertium) -> None:  # type: ignore[no-untyped-def]
    """Issue 27: the slide "Keynote on machine learning" came out "Keynote Encima aprendizaje"."""
    es = apertium.translate(["Keynote on machine learning", "Talk on machine learning", "The talk is on climate "
                             "change.", "Put the book on the table."], "en", "es")
    assert es[0].endswith("sobre aprendizaje de máquina") and es[1] == "Charla sobre aprendizaje de máquina"
    assert "sobre cambio de clima" in es[2] and "en la mesa" in es[3]
    assert not any("ncima" in t for t in es[:3])


def test_please_is_a_request_not_a_verb(apertium) -> None:  # type: ignore[no-untyped-def]
    es = apertium.translate(["Please call your sister.", "Could you please send it?"], "en", "es")
    assert es[0].startswith("Por favor,") and "por favor" in es[1]
    assert not any("omplacer" in t for t in es)
    assert "si us plau" in apertium.translate(["Could you please send it?"], "en", "ca")[0]


def test_no_double_spaces_and_by_half(apertium) -> None:  # type: ignore[no-untyped-def]
    a, b = apertium.translate(["If you have time, come.", "Cut emissions by half before 2030."], "en", "es")
    assert "  " not in a and " ," not in a
    assert "a la mitad" in b and "medios" not in b


def test_a_sentence_split_across_segments_is_translated_whole(apertium) -> None:  # type: ignore[no-untyped-def]
    from lingua_fusion.config import Settings
    from lingua_fusion.files.engine import FileCall, OwnEngine
    from lingua_fusion.files.mt import SegmentMT
    from lingua_fusion.models.registry import Registry

    registry = Registry(Settings())
    engine = OwnEngine(registry, Settings())  # the file path's MT runs on the engine (files/engine.py)
    try:
        segs = [seg(0, 3, "I will ask her to bring these"), seg(3.2, 5, "things with her from the store.")]
        SegmentMT(registry, lambda: engine.link).translate(segs, registry.mt_route("en", "es"), [], {}, FileCall(),
                                                           sentences=True)
        joined = " ".join(s.text for s in segs)
        alone = registry.route_translator(registry.mt_route("en", "es"))(
            ["I will ask her to bring these things with her from the store."])[0]
        assert joined == alone  # what the whole sentence gives as text, spread over the two segments
        assert all(s.text for s in segs)
    finally:
        engine.close()
        registry.close()


def test_a_short_clip_with_a_prompt_as_long_as_its_budget_is_decoded() -> None:
    """The input behind "asr:tiny.en failed on a batch of 1: The maximum decoding length must be > 0" in video
    streams: a 1 s clip (a budget of 24 tokens) whose prompt (slide words) fed 24 tokens at once."""
    import numpy as np

    from lingua_fusion.config import Settings
    from lingua_fusion.models.asr_whisper import decode_length
    from lingua_fusion.models.registry import Registry

    assert decode_length(24, 23) == 24 and decode_length(24, 24) == 48 and decode_length(300, 400) == 448
    registry = Registry(Settings())
    clip = np.random.default_rng(0).normal(0, 0.01, 16000).astype(np.float32)
    for n in (21, 22, 23, 60):
        out = registry.asr("en").transcribe_batch([clip], language="en", prompts=[" ".join(["cluster"] * n)])
        assert len(out) == 1
    registry.close()


def test_marks_of_unknown_words_come_off_and_the_words_are_named() -> None:
    from lingua_fusion.untranslated import strip_marks

    assert strip_marks("Le temps sera **soleado et les *criar la rivière.") == (
        "Le temps sera soleado et les criar la rivière.", ["soleado", "criar"])
    assert strip_marks("3*4 = 12, a*b") == ("3*4 = 12, a*b", [])


# ---- routes chosen and labelled by measurement --------------------------------------------------------------------
def test_the_route_is_chosen_and_labelled_by_its_measured_quality(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from lingua_fusion.config import Settings
    from lingua_fusion.models.registry import Registry

    table = tmp_path / "route_quality.json"
    table.write_text(json.dumps({"pairs": {"en-fr": {"routes": {
        "apertium en->es, apertium es->fr": {"chrf": 41.0}, "apertium en->ca, apertium ca->fr": {"chrf": 52.0}}},
        "en-es": {"routes": {"apertium en->es": {"chrf": 38.0}}}}}))
    reg = Registry(Settings(), route_quality=table)
    fr = reg.mt_route("en", "fr")
    assert fr.describe() == "apertium en->ca, apertium ca->fr" and fr.chrf == 52.0 and fr.tier == "standard"
    es = reg.mt_route("en", "es")  # rule-based, but measured weak: said so
    assert es.low_confidence and es.tier == "low-confidence" and es.llm_legs == 0
    unmeasured = Registry(Settings(), route_quality=tmp_path / "none.json").mt_route("en", "es")
    assert unmeasured.chrf is None and unmeasured.tier == "standard"
    routes = {r["pair"]: r for r in reg.pair_routes()}
    assert routes["en-fr"]["chrf"] == 52.0 and routes["en-es"]["tier"] == "low-confidence"


def test_a_files_segments_and_a_streams_utterance_get_the_same_guard() -> None:
    from lingua_fusion.models.base import ASRSegment
    from lingua_fusion.models.transcript_guard import guard_segments, guard_text

    segs = [ASRSegment(0.0, 2.0, "天氣很好", 0.9), ASRSegment(2.0, 9.0, "你好" + "天" * 200, 0.8),
            ASRSegment(9.0, 9.5, "", 0.5)]
    out, warnings = guard_segments(segs, "Hans")
    assert [(s.text, s.confidence) for s in out] == [("天气很好", 0.9), ("你好天", 0.05)]  # the empty one dropped
    assert warnings == ["possible hallucination at 2.0-9.0 s: a repetition loop was cut"]
    assert guard_text("天氣" + "好" * 50, 0.7, "Hant") == ("天氣好", 0.05)
    assert guard_text("We deploy on Kubernetes.", 0.7, None) == ("We deploy on Kubernetes.", 0.7)
