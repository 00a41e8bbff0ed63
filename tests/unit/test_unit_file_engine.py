"""A file's work on the engine (files/engine.py, files/pieces.py, serving/executor.py): speech cut into pieces at
its pauses, each piece a work item of its own batch; a file's calls end by its deadline and leave the queues; file
work feeds no stream's SLO breaker nor admission's cost model; and the engine answers a file's typed payloads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lingua_fusion.config import Settings
from lingua_fusion.deadline import Deadline
from lingua_fusion.errors import BackendError, RequestTimeout
from lingua_fusion.files.engine import WINDOW, EngineLink, FileCall
from lingua_fusion.files.mt import applied_terms
from lingua_fusion.files.pieces import RATE, cuts
from lingua_fusion.files.result import spoken_pieces
from lingua_fusion.glossary import Term
from lingua_fusion.models.base import ASRResult, ASRSegment
from lingua_fusion.serving.demand import ASR_MAX_UNITS
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import FILE_CLASS, AsrInput, AsrOutput, CallContext, MtInput, TranscribeInput


def speech(seconds: float, quiet: list[tuple[float, float]] = (), seed: int = 0) -> np.ndarray:  # type: ignore[assignment]
    audio = np.random.default_rng(seed).normal(0, 0.3, int(seconds * RATE)).astype(np.float32)
    for a, b in quiet:
        audio[int(a * RATE):int(b * RATE)] *= 0.001
    return audio


def test_speech_within_one_window_is_one_piece_and_exactly_30_s_is_still_one() -> None:
    assert cuts(speech(12.0)) == [(0, 12 * RATE)]
    assert cuts(speech(30.0)) == [(0, 30 * RATE)]
    assert len(cuts(speech(30.0 + 1 / RATE))) == 2


def test_a_long_recording_is_cut_in_its_pauses_and_the_pieces_cover_it_in_order() -> None:
    audio = speech(75.0, quiet=[(24.0, 24.6), (47.0, 47.5)])
    ranges = cuts(audio)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(audio)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # no gap, no overlap
    assert all(b - a <= 30 * RATE for a, b in ranges)
    assert 24.0 <= ranges[0][1] / RATE <= 24.6  # in the pause, not at 30 s in the middle of a word
    assert 47.0 <= ranges[1][1] / RATE <= 47.5


def test_text_is_spoken_in_pieces_of_whole_sentences() -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    pieces = spoken_pieces(text, most=100)
    assert " ".join(pieces) == text
    assert all(len(p) <= 100 and p.endswith(".") for p in pieces)
    assert spoken_pieces("") == [""]


def test_applied_terms_are_those_found_in_the_source_and_kept_in_the_translation() -> None:
    terms = [Term("LinguaFusion", "LinguaFusion"), Term("keynote", "ponencia"), Term("absent", "ausente")]
    used = applied_terms(["Welcome to the LinguaFusion keynote"], ["Bienvenidos a la ponencia de LinguaFusion"],
                         terms)
    assert {t.source for t in used} == {"LinguaFusion", "keynote"}
    assert applied_terms(["the keynote"], ["la conferencia"], terms) == []  # found, but MT did not keep it


def test_wavs_of_one_voice_join_into_one_file() -> None:
    import io
    import wave

    from lingua_fusion.models.tts import join_wavs, to_wav

    one, two = to_wav(np.zeros(800, np.float32), 16000), to_wav(np.ones(1600, np.float32) * 0.1, 16000)
    with wave.open(io.BytesIO(join_wavs([one, two]))) as w:
        assert w.getnframes() == 2400 and w.getframerate() == 16000


class Port:
    """A ModelPort that answers after ``delay`` seconds, or never; records what it was given."""

    def __init__(self, delay: float = 0.0, answer: Any = "ok") -> None:
        self.delay, self.answer = delay, answer
        self.seen: list[tuple[ModelKey, Any, CallContext]] = []
        self.running = 0
        self.most = 0
        self.cancelled = 0

    async def run(self, key: ModelKey, payload: Any, ctx: CallContext) -> Any:
        self.seen.append((key, payload, ctx))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        return self.answer

    def depth(self, key: ModelKey) -> int:
        return 0


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(5)
    lp.close()


def test_a_files_items_go_in_windows_under_the_file_class_and_its_key(loop: asyncio.AbstractEventLoop) -> None:
    port = Port(delay=0.01)
    link = EngineLink(port, loop, timeout_s=10)
    items = [MtInput(f"text {i}") for i in range(WINDOW * 2 + 3)]
    out = link.translate(ModelKey.mt("en", "es"), items, FileCall(key_id="key-a"))
    assert out == ["ok"] * len(items)
    assert port.most == WINDOW  # a window at a time: one file never fills a model's queue
    assert {(c.slo, c.key_id) for _k, _p, c in port.seen} == {(FILE_CLASS, "key-a")}
    assert len({c.stream_id for _k, _p, c in port.seen}) == 1


def test_a_call_past_the_requests_deadline_is_a_timeout_and_its_items_leave(loop: asyncio.AbstractEventLoop) -> None:
    port = Port(delay=60)
    link = EngineLink(port, loop, timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(RequestTimeout):
        link.translate(ModelKey.mt("en", "es"), [MtInput("a"), MtInput("b")], FileCall(deadline=Deadline(0.3)))
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while port.cancelled < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert port.cancelled == 2  # the engine's callers were cancelled: their items are withdrawn


def test_a_wrong_answer_is_a_typed_backend_error(loop: asyncio.AbstractEventLoop) -> None:
    link = EngineLink(Port(answer=42), loop, timeout_s=10)
    with pytest.raises(BackendError):
        link.translate(ModelKey.mt("en", "es"), [MtInput("a")], FileCall())


def test_a_call_from_the_engines_own_loop_is_refused_not_deadlocked() -> None:
    async def main() -> None:
        link = EngineLink(Port(), asyncio.get_running_loop(), timeout_s=10)
        with pytest.raises(RuntimeError):
            link.translate(ModelKey.mt("en", "es"), [MtInput("a")], FileCall())

    asyncio.run(main())


class Observer:
    def __init__(self) -> None:
        self.samples: list[tuple[str, str]] = []

    def stage_done(self, slo: str, stage: str, seconds: float, key_id: str = "") -> None:
        self.samples.append((slo, stage))


def test_a_files_piece_runs_alone_and_feeds_no_breaker_nor_cost_model() -> None:
    batches: list[list[str]] = []

    def runner(items: list[Any]) -> list[Any]:
        batches.append([type(it).__name__ for it in items])
        time.sleep(0.05)
        return [ASRResult("piece", "en", [ASRSegment(0.0, 1.0, "piece", 0.9)], 1.0) if isinstance(it, TranscribeInput)
                else AsrOutput("utterance", 0.9) for it in items]

    async def main() -> tuple[Executor, Observer]:
        observer = Observer()
        ex = Executor(None, Settings(), observer=observer,  # type: ignore[arg-type]
                      backends={"asr": lambda key: runner})
        key = ModelKey.asr("en")
        ex.build_now(key)
        ex.threads.warm.add(key)
        file_ctx = CallContext(stream_id="file:1", slo=FILE_CLASS, key_id="a")
        piece = TranscribeInput(np.zeros(30 * RATE, np.float32), "en")
        utterances = [ex.run(key, AsrInput(np.zeros(RATE, np.float32)), CallContext(f"s{i}", key_id="b"))
                      for i in range(3)]
        before = ex.scheduler.costs[key].observations
        results = await asyncio.gather(ex.run(key, piece, file_ctx), ex.run(key, piece, file_ctx), *utterances)
        assert isinstance(results[0], ASRResult) and results[0].text == "piece"
        assert all(isinstance(r, AsrOutput) for r in results[2:])
        assert ex.scheduler.costs[key].observations - before == len(
            [b for b in batches if "TranscribeInput" not in b])
        await ex.close()
        return ex, observer

    _ex, observer = asyncio.run(main())
    assert all(b == ["TranscribeInput"] for b in batches if "TranscribeInput" in b)  # a piece is a batch alone
    assert ASR_MAX_UNITS >= 1
    assert observer.samples and all(slo != FILE_CLASS for slo, _stage in observer.samples)
    assert ("standard", "asr") in observer.samples


class Link:
    """An EngineLink's transcribe: each piece's first segment says its length; the language is 'en'."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TranscribeInput]]] = []

    def transcribe(self, key: ModelKey, pieces: list[TranscribeInput], call: FileCall) -> list[ASRResult]:
        self.calls.append((str(key), list(pieces)))
        return [ASRResult("x", "en", [ASRSegment(0.5, len(p.audio) / RATE, "x", 0.9)], 0.97) for p in pieces]


def test_a_file_of_unknown_language_is_told_by_its_first_piece_and_the_same_model_does_the_rest() -> None:
    from lingua_fusion.files.speech import SpeechRecogniser

    link = Link()
    speech_rec = SpeechRecogniser(None, lambda: link)  # type: ignore[arg-type, return-value]
    audio = speech(75.0, quiet=[(24.0, 24.6), (47.0, 47.5)])
    res = speech_rec._in_pieces(audio, None, "transcribe", None, None, FileCall())
    (first_key, first), (rest_key, rest) = link.calls
    assert first_key == rest_key == "asr:base:" and first[0].language is None and len(first) == 1
    assert all(p.language == "en" and p.multilingual for p in rest) and len(rest) == 2
    assert res.language == "en" and res.language_probability == 0.97
    assert [round(s.start, 1) for s in res.segments] == [0.5, round(cuts(audio)[1][0] / RATE + 0.5, 1),
                                                          round(cuts(audio)[2][0] / RATE + 0.5, 1)]
    link.calls.clear()
    speech_rec._in_pieces(audio, "en", "transcribe", None, None, FileCall())
    ((key, pieces),) = link.calls  # a language given: every piece at once, on its own model
    assert key == "asr:tiny.en" and len(pieces) == 3 and not any(p.multilingual for p in pieces)
