"""The continuous engine behind the server's ModelPort (issue 12, ``LINGUAFUSION_MODELS__ENGINE=continuous``), on
the CPU with the shipped Whisper weights: the same transcripts as the torch backend through the same Executor, and
a live server stream through the engine with its pool gauges on /metrics."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import jiwer
import numpy as np
import pytest
from conftest import metric, piper_wav, start_server, stop_server, talk_wav

from lingua_fusion import MultimodalTranslator
from lingua_fusion.config import LimitSettings, Settings
from lingua_fusion.media.audio import decode_audio
from lingua_fusion.models.registry import Registry
from lingua_fusion.observability import Metrics
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.gpu.deferred import DeferredRunner
from lingua_fusion.serving.gpu.runner import GpuRunner
from lingua_fusion.serving.gpu.server import build_executor, engine_backends
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, CallContext

pytestmark = pytest.mark.slow

SENTENCES = ["The meeting starts at ten o'clock in the main hall.", "Please send me the report before Friday.",
             "Our new product will be available in three colours.", "The train to the airport leaves every hour."]


def pcm(wav: bytes) -> np.ndarray:
    return decode_audio(wav, LimitSettings())[0]


def _norm(s: str) -> str:
    return jiwer.RemovePunctuation()(s.lower()).strip()


async def _transcripts(executor: Executor, clips: list[tuple[np.ndarray, str | None]]) -> list[tuple[str, float]]:
    key = ModelKey.asr("en")
    try:
        outs = await asyncio.gather(*(executor.run(key, AsrInput(a, prompt=p), CallContext(stream_id=f"s{i}"))
                                      for i, (a, p) in enumerate(clips)))
    finally:
        await executor.close()
    return [(o.text, o.confidence) for o in outs]


@pytest.mark.parametrize("max_batch", [1024, 1])
async def test_engine_transcripts_equal_the_torch_backend(max_batch: int) -> None:
    """The engine's transcripts are the torch backend's, batched or one item at a time (``engine_max_batch=1``:
    the per-stream baseline of bench/gpu_product.py)."""
    clips: list[tuple[np.ndarray, str | None]] = [(pcm(piper_wav(s)), None) for s in SENTENCES]
    clips.append((clips[1][0], "the quarterly report"))  # a prompt (a slide's words) before the start token
    clips.append((pcm(talk_wav(SENTENCES[:2])), None))  # two sentences in one clip (a longer window)

    torch_settings = Settings(models={"backend": "torch"})  # type: ignore[arg-type]
    expected = await _transcripts(Executor(Registry(torch_settings), torch_settings), clips)

    settings = Settings(models={"engine": "continuous", "device": "cpu",  # type: ignore[arg-type]
                                "engine_max_batch": max_batch})
    metrics = Metrics()
    registry = Registry(settings)
    executor = build_executor(registry, settings, metrics)
    assert set(executor.backends) == {"asr"}  # MT on its CPU runner, VAD Silero (not CUDA)
    deferred = executor._runner(ModelKey.asr("en"))
    assert isinstance(deferred, DeferredRunner)  # built on its own thread, not on the event loop
    got = await _transcripts(executor, clips)
    runner = deferred.built
    assert isinstance(runner, GpuRunner)

    assert [t for t, _ in got] == [t for t, _ in expected], (got, expected)
    if max_batch == 1:  # every decode step carried one sequence
        assert runner.engine.max_batch == 1 and runner.load.step_rows == runner.load.steps > 0
    for (_, c_engine), (text, c_torch) in zip(got, expected, strict=True):
        assert text and 0.3 < c_engine <= 1.0 and abs(c_engine - c_torch) < 0.25
    # each clip encoded once, or its encoder output reused (the same audio handed over after the first was
    # encoded: the executor hands a continuous runner at most its window of items at a time)
    assert runner.encoded + runner.reused == len(clips) and runner.engine.idle()
    assert registry.loaded() == ["asr:tiny.en:torch"]  # the shipped weights in the torch model, nothing else
    scraped = _scrape(metrics)
    assert 'linguafusion_gpu_pool_blocks{model="asr:tiny.en",pool="self",state="free"}' in scraped


def _scrape(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_engine_off_by_default() -> None:
    settings = Settings()
    assert settings.models.engine == "" and engine_backends(None, settings) == {}
    assert not any(m["name"].endswith("-continuous") for m in Registry(settings).capabilities())
    with pytest.raises(ValueError):
        Settings(models={"engine": "vllm"})  # type: ignore[arg-type]


ENGINE_ENV = {"LINGUAFUSION_MODELS__ENGINE": "continuous", "LINGUAFUSION_MODELS__DEVICE": "cpu"}
WARM_ENV = {**ENGINE_ENV, "LINGUAFUSION_MODELS__ENGINE_WARM": '["en"]'}


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, proc = start_server(tmp_path_factory.mktemp("engine"), "--no-auth", env=ENGINE_ENV)
    yield url
    stop_server(proc)



def test_a_warm_language_is_built_before_the_server_is_ready(tmp_path: Path) -> None:
    """``models.engine_warm``: the English runner is built at start (its pools on /metrics before any stream), and
    /readyz says ready only once it is, naming its state; without it the first stream would wait for the build."""
    url, proc = start_server(tmp_path, "--no-auth", env=WARM_ENV)
    try:
        ready = httpx.get(url + "/readyz", timeout=10)  # start_server returned: /readyz answered 200
        assert ready.status_code == 200 and ready.json()["engine"] == {"asr:tiny.en": "ready"}
        text = httpx.get(url + "/metrics", timeout=10).text
        assert metric(text, "linguafusion_streams_admitted_total") == 0  # no stream has asked for it
        assert metric(text, 'linguafusion_gpu_pool_blocks{model="asr:tiny.en",pool="self",state="free"}') > 0
    finally:
        stop_server(proc)


def test_a_model_process_builds_its_warm_language_at_start(tmp_path: Path) -> None:
    """Under ``serve --workers`` each model process warms its own engine, and a worker's /readyz says ready only
    once its model process has built it (naming its state), with no stream opened."""
    url, proc = start_server(tmp_path, "--no-auth", "--workers", "2", env=WARM_ENV)
    try:
        for _ in range(4):  # either worker may answer
            ready = httpx.get(url + "/readyz", timeout=10)
            assert ready.status_code == 200 and ready.json()["engine"] == {"asr:tiny.en": "ready"}, ready.text
            assert ready.json()["model_process"] == "ok"
        assert metric(httpx.get(url + "/metrics", timeout=10).text, "linguafusion_streams_admitted_total") == 0
    finally:
        stop_server(proc)


def test_the_warm_languages_default_to_english_on_cuda_only() -> None:
    def langs(**models: object) -> list[str]:
        return Settings(models=models).models.engine_warm_langs()  # type: ignore[arg-type]

    assert langs(engine="continuous", device="cuda") == ["en"] and langs(engine="continuous", device="cpu") == []
    assert langs(device="cuda") == []  # the engine off: nothing to warm
    assert langs(engine="continuous", device="cpu", engine_warm=["de", "en", "de"]) == ["de", "en"]


async def test_live_stream_through_the_engine(engine_server: str, tmp_path: Path) -> None:
    audio = pcm(talk_wav(SENTENCES))
    data = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    t = MultimodalTranslator(base_url=engine_server)
    async with t.stream(["es"], partials=True, slo="batch") as s:
        for at in range(0, len(data), 16000):  # 0.5 s messages
            await s.send_audio(data[at: at + 16000], ts=at / 32000)
        await s.end()
        finals = [e async for e in s if e.type == "final"]
    assert len(SENTENCES) <= len(finals) <= len(SENTENCES) + 2, [f.source_text for f in finals]
    spoken = " ".join(f.source_text or "" for f in finals)
    assert jiwer.wer(_norm(" ".join(SENTENCES)), _norm(spoken)) <= 0.15, spoken
    assert all(f.text and f.text != f.source_text for f in finals)  # translated (MT on its CPU runner)
    models = httpx.get(engine_server + "/v1/models", timeout=10).json()["models"]
    engine = [m for m in models if m["name"] == "whisper-tiny.en-torch-continuous"]
    assert engine and engine[0]["task"] == "asr" and "continuous engine (cpu)" in engine[0]["quality"]
    text = httpx.get(engine_server + "/metrics", timeout=10).text
    assert metric(text, 'linguafusion_gpu_pool_blocks{model="asr:tiny.en",pool="self",state="free"}') > 0
    assert metric(text, 'linguafusion_gpu_pool_bytes{model="asr:tiny.en",pool="cross"}') > 0
    assert re.search(r'linguafusion_gpu_encoder_cache_entries\{model="asr:tiny.en"\} \d', text)
    assert metric(text, 'linguafusion_batch_size_count{model="asr:tiny.en"}') >= len(SENTENCES)
    # what the runner's thread did: a row of a benchmark reads its mean batch and busy share from these
    steps = metric(text, 'linguafusion_gpu_runner_steps_total{model="asr:tiny.en"}')
    rows = metric(text, 'linguafusion_gpu_runner_step_rows_total{model="asr:tiny.en"}')
    assert steps >= len(SENTENCES) and rows >= steps
    assert metric(text, 'linguafusion_gpu_runner_busy_seconds_total{model="asr:tiny.en",phase="step"}') > 0
    assert metric(text, 'linguafusion_gpu_runner_started_items_total{model="asr:tiny.en"}') >= len(SENTENCES)


async def test_a_timestamp_gap_is_not_captioned_as_an_utterance(engine_server: str) -> None:
    """A client whose media clock jumps a minute (paused, then resumed with a later ``ts``) sends the gap as
    silence: no final spans it. The open utterance was held across the gap and cut there as 57 s of silence, which
    Whisper captioned "you" (a final from 2.8 s to 60 s), while the speech after the gap came late."""
    audio = pcm(talk_wav(SENTENCES[:2]))
    data = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    half = len(data) // 4 * 2  # mid-sentence: an utterance is open when the gap comes
    t = MultimodalTranslator(base_url=engine_server)
    async with t.stream(["es"], partials=False, slo="standard") as s:
        await s.send_audio(data[:half], ts=0.0)
        await s.send_audio(data[half:], ts=60.0)
        await s.end()
        finals = [e async for e in s if e.type == "final"]
    assert finals, "no caption"
    for f in finals:
        assert f.end - f.start <= 10.0, (f.start, f.end, f.source_text)  # standard's longest utterance
        assert not f.start < half / 32000 < 60.0 < f.end, (f.start, f.end, f.source_text)
