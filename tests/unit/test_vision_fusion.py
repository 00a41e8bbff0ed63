"""Fusion of speech with lip and sign evidence: confirmation, re-ranking, replacement of a doubtful word,
confidence gating, a modality dropping out, and the modalities each caption names."""

from __future__ import annotations

from lingua_fusion.vision.fusion import AsrHypothesis, Evidence, FusionPolicy, Word, fuse

VOCAB = {"yes", "no", "stop", "go"}


def _hyp(text: str, confidence: float, probs: list[float] | None = None) -> AsrHypothesis:
    words = text.split()
    probs = probs or [0.9] * len(words)
    return AsrHypothesis(tuple(Word(w, 0.5 * i, 0.5 * i + 0.4, p) for i, (w, p) in enumerate(zip(words, probs,
                                                                                                 strict=True))),
                         confidence)


def _lip(word: str, index: int, confidence: float = 0.8) -> Evidence:
    return Evidence(word, 0.5 * index, 0.5 * index + 0.4, confidence, "lips")


def test_lips_that_agree_confirm_the_speech() -> None:
    cap = fuse([_hyp("please stop now", 0.8)], [_lip("stop", 1)], VOCAB)
    assert cap is not None and cap.text == "please stop now" and cap.modalities == ("audio", "lips")
    assert cap.confidence > 0.8


def test_lips_re_rank_the_hypotheses() -> None:
    hyps = [_hyp("please go now", 0.62), _hyp("please no now", 0.6)]
    cap = fuse(hyps, [_lip("no", 1, 0.9)], VOCAB)
    assert cap is not None and cap.text == "please no now" and cap.modalities == ("audio", "lips")


def test_a_doubtful_vocabulary_word_is_replaced_by_a_confident_lip_reading() -> None:
    cap = fuse([_hyp("say yes please", 0.7, [0.9, 0.3, 0.9])], [_lip("no", 1, 0.8)], VOCAB)
    assert cap is not None and cap.text == "say no please" and cap.replaced == (("yes", "no"),)
    sure = fuse([_hyp("say yes please", 0.7, [0.9, 0.95, 0.9])], [_lip("no", 1, 0.8)], VOCAB)
    assert sure is not None and sure.text == "say yes please"  # ASR was sure of it: kept


def test_lips_say_nothing_about_words_outside_their_vocabulary() -> None:
    cap = fuse([_hyp("the weather is fine", 0.8)], [_lip("stop", 2)], VOCAB)
    assert cap is not None and cap.text == "the weather is fine" and cap.modalities == ("audio",)


def test_low_confidence_speech_gives_way_to_signs() -> None:
    signs = [Evidence("HELLO", 0.0, 0.8, 0.7, "sign"), Evidence("FRIEND", 1.0, 1.6, 0.6, "sign")]
    cap = fuse([_hyp("mumble grumble", 0.2)], signs, VOCAB, FusionPolicy(min_asr_confidence=0.4))
    assert cap is not None and cap.text == "HELLO FRIEND" and cap.modalities == ("sign",)
    assert (cap.start, cap.end) == (0.0, 1.6)


def test_when_audio_drops_out_the_caption_comes_from_what_was_seen() -> None:
    cap = fuse([], [_lip("yes", 0, 0.7)], VOCAB)
    assert cap is not None and cap.text == "yes" and cap.modalities == ("lips",)
    assert fuse([], [], VOCAB) is None
    speech_only = fuse([_hyp("go", 0.3)], [], VOCAB)  # unsure speech, nothing else: the speech gate decides
    assert speech_only is not None and speech_only.modalities == ("audio",)
