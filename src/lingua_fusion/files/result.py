"""A finished request -> its TranslationResult: the warnings a user needs (detection, nothing translated, speech
translation, low-confidence routes), the route described, then the output modality rendered (TTS WAV, braille)."""

from __future__ import annotations

from .. import langs
from ..glossary import Term
from ..models.registry import Registry
from ..models.routes import LOW_CHRF
from ..types import Modality, Segment, SignText, SlideText, TranslationResult
from ..untranslated import warning as untranslated_warning
from .engine import EngineLink, FileCall
from .recognise import SENTENCE
from .request import ValidRequest
from .work import Stages, Work

SPEECH_CONFIDENT = 0.5  # a spoken-language detection below this is reported as LOW
SPOKEN_PIECE_CHARS = 400  # characters of text per TTS work item (a few sentences; a longer sentence goes whole)


def spoken_pieces(text: str, most: int = SPOKEN_PIECE_CHARS) -> list[str]:
    """``text`` as whole sentences grouped into pieces of at most ``most`` characters (one piece when empty)."""
    pieces: list[str] = []
    for sentence in (p.strip() for p in SENTENCE.split(text)):
        if not sentence:
            continue
        if pieces and len(pieces[-1]) + 1 + len(sentence) <= most:
            pieces[-1] += " " + sentence
        else:
            pieces.append(sentence)
    return pieces or [text]


def say_what_happened(work: Work) -> None:
    """Warnings for everything a user could take for a translation when it is not quite one."""
    assert work.source is not None
    name = f"{langs.name(work.source)} ({work.source})"
    if work.detected:
        sure = work.confidence is not None and work.confidence >= SPEECH_CONFIDENT
        work.warnings.insert(0, f"detected source language: {work.source} ({langs.name(work.source)}), "
                             f"confidence {work.confidence:.2f}"
                             + ("" if sure else " (LOW: the detection may be wrong)")
                             + "; pass source_lang to set it")
    if work.source == work.target and not work.transcribe_only:
        work.warnings.append(f"nothing was translated: the input is already in {name}"
                             + (" (detected)" if work.detected else " (source_lang equals target_lang)")
                             + ("; pass source_lang if it is another language" if work.detected else ""))
    if work.speech_translation:
        work.warnings.append(f"no model translates {work.source} -> {work.target} text: Whisper translated "
                             "the speech into English" + ("" if work.target == "en" else
                                                          f", then {work.route.describe() if work.route else ''}"))
    if work.untranslated:
        work.warnings.append(untranslated_warning(work.untranslated, work.target))
    route = work.route
    if route is not None and route.llm_legs:
        times = "twice" if route.llm_legs > 1 else "once"
        work.warnings.append(f"low-confidence translation: this pair goes through the tiny LLM {times} "
                             f"({route.describe()}); it is slow and often changes facts out of English")
    elif route is not None and route.low_confidence:
        work.warnings.append(f"low-confidence translation: this route ({route.describe()}) measured chrF "
                             f"{route.chrf:.0f} on held-out conference sentences (standard is {LOW_CHRF:.0f} or "
                             "better): expect mistranslated words")


def assemble(valid: ValidRequest, work: Work, segs: list[Segment], slides: list[SlideText], signs: list[SignText],
             applied: list[Term]) -> TranslationResult:
    """The result's text (the speech's, else the slides' or the signs'), route, quality and warnings."""
    assert work.source is not None
    work.models = {k: v for k, v in work.models.items() if v}
    say_what_happened(work)
    route = work.route
    described = route.describe() if route else None
    if work.speech_translation:
        described = "whisper speech->en" + (f", {described}" if described else "")
    shown = segs or slides or signs  # a video without speech: its slides (or signs) are its text
    return TranslationResult(
        text=("\n\n" if not segs else " ").join(s.text for s in shown).strip(),
        source_text=("\n\n" if not segs else " ").join(s.source_text for s in shown).strip(), slides=slides,
        signs=signs,
        source_lang=work.source, target_lang=work.target, source_modality=valid.source_modality.value,
        target_modality=valid.target_modality.value, segments=segs, models=work.models,
        pivot="en" if work.speech_translation and route else (route.pivot if route else None),
        route=described, quality=(route.tier if route else ("standard" if work.speech_translation else None)),
        low_confidence=bool(route and route.low_confidence), warnings=work.warnings, duration_s=work.duration,
        source_lang_detected=work.detected, source_lang_confidence=work.confidence,
        glossary_terms_applied=[{"source": t.source, "target": t.target} for t in applied])


def render(registry: Registry, engine: EngineLink, call: FileCall, result: TranslationResult, tgt_mod: Modality,
           st: Stages) -> None:
    """The output modality: speech -> ``result.audio`` (WAV, spoken on the engine a few sentences per work item),
    braille -> ``result.braille``; text needs nothing."""
    if tgt_mod == Modality.SPEECH:
        with st.stage("tts"):
            result.models["tts"] = registry.tts_name(result.target_lang)
            result.audio = engine.speak(result.target_lang, spoken_pieces(result.text), call)
            result.audio_format = "wav"
    elif tgt_mod == Modality.BRAILLE:
        with st.stage("braille"):
            br = registry.braille()
            result.models["braille"] = br.info.name
            result.braille = br.translate(result.text, language=result.target_lang)
