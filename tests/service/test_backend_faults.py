"""Model backend faults (raise, hang, garbage) injected into a live --chaos server: every committed caption still
comes out, numbered without gaps, marked ``failed`` while the backend is broken and translated again once it is not.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import start_server, stop_server

from lingua_fusion import MultimodalTranslator
from lingua_fusion.errors import InvalidParameter, MalformedOutput
from lingua_fusion.serving.faults import garble, parse_fault, pick
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, MtInput
from lingua_fusion.serving.threads import check_outputs


@pytest.fixture(scope="module")
def chaos_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, proc = start_server(tmp_path_factory.mktemp("faults"), "--no-auth", "--chaos",
                             env={"LINGUAFUSION_SERVER__MODEL_TIMEOUT_S": "3",
                                  "LINGUAFUSION_SERVER__MODEL_TIMEOUT_FACTOR": "1"})  # give up after 3 s, load or not
    try:
        asyncio.run(_captions(url, ["Hello."]))  # the translation model has answered once (no cold timeout)
        yield url
    finally:
        stop_server(proc)


async def _captions(url: str, sentences: list[str], between: Any = None) -> list[dict[str, Any]]:
    """Send text sentences on one stream, each after the previous one's final (``between(i)`` runs after final
    i arrives); return every event."""
    t = MultimodalTranslator(base_url=url)
    events: list[dict[str, Any]] = []
    got: asyncio.Queue[int] = asyncio.Queue()
    async with t.stream(["es"], slo="batch", partials=False) as s:
        async def send() -> None:
            for i, text in enumerate(sentences):
                await s.send_text(text)
                await asyncio.wait_for(got.get(), timeout=60)
                if between is not None:
                    await between(i)
            await s.end()

        sender = asyncio.create_task(send())
        async for ev in s:
            events.append(ev.model_dump(exclude_none=True))
            if ev.type == "final":
                got.put_nowait(ev.seq or 0)
        await sender
    return events


def _finals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    finals = [e for e in events if e["type"] == "final"]
    assert [f["seq"] for f in finals] == list(range(1, len(finals) + 1))  # gap-free, nothing twice
    return finals


@pytest.mark.parametrize("kind", ["error", "garbage", "hang"])
async def test_a_broken_translation_backend_marks_captions_and_recovers(chaos_url: str, kind: str) -> None:
    async with httpx.AsyncClient(base_url=chaos_url, timeout=10) as http:
        await http.delete("/v1/admin/faults")
        # a hung call blocks its thread for 8 s; the server gives up on it after its model timeout (3 s here)
        r = await http.post("/v1/admin/faults", json={"model": "mt", "kind": kind, "delay_s": 8.0})
        assert r.status_code == 201, r.text

        async def heal(i: int) -> None:
            if i == 1:  # two sentences under the fault, then the backend is healthy again
                await http.delete("/v1/admin/faults")
                async with asyncio.timeout(30):  # abandoned hung calls end after their 8 s
                    while (await http.get("/v1/admin/faults")).json()["stuck_calls"]:  # noqa: ASYNC110
                        await asyncio.sleep(0.1)

        sentences = ["The house is very big.", "The dog is black.", "The weather is good today."]
        events = await _captions(chaos_url, sentences, heal)
        metrics = (await http.get("/metrics")).text
    finals = _finals(events)
    assert len(finals) == 3  # no caption is lost to the broken backend
    for f in finals[:2]:
        assert f["failed"] == ["mt:es"] and f["text"] == "" and f["source_text"], f
        assert "translation to es failed" in f["note"]
    assert "failed" not in finals[2] and "tiempo" in finals[2]["text"].lower(), finals[2]
    code = {"error": "injected_fault", "garbage": "malformed_output", "hang": "model_timeout"}[kind]
    assert f'code="{code}"' in metrics
    assert "linguafusion_model_retries_total" in metrics


async def test_a_fault_after_n_calls_spares_the_first_ones(chaos_url: str) -> None:
    async with httpx.AsyncClient(base_url=chaos_url, timeout=10) as http:
        await http.delete("/v1/admin/faults")
        assert (await http.post("/v1/admin/faults", json={"model": "mt", "kind": "error", "after": 1})).status_code \
            == 201
        try:
            events = await _captions(chaos_url, ["The house is very big.", "The dog is black."])
            listed = (await http.get("/v1/admin/faults")).json()["faults"]["mt/error"]
        finally:
            await http.delete("/v1/admin/faults")
    finals = _finals(events)
    assert "failed" not in finals[0] and finals[0]["text"]
    assert finals[1]["failed"] == ["mt:es"]
    assert listed["fired"] >= 3  # the second sentence: first try and both retries


def test_bad_fault_requests_are_refused_with_a_code(chaos_url: str) -> None:
    for body in ({"kind": "meltdown"}, {"model": "gpu"}, {"fraction": 2}, {"delay_s": "x"}, [1, 2], '{"after": 1e999}',
                 '{"delay_s": NaN}'):
        r = httpx.post(chaos_url + "/v1/admin/faults", timeout=10, headers={"Content-Type": "application/json"},
                       **({"content": body} if isinstance(body, str) else {"json": body}))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter", (body, r.text)
    r = httpx.post(chaos_url + "/v1/admin/faults", timeout=10, content='{"kind": "error"}')  # no Content-Type
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_content_type"


# ---- units -----------------------------------------------------------------------------------------------------
def test_output_check_rejects_what_cannot_be_a_caption() -> None:
    mt, asr, tts = ModelKey.mt("en", "es"), ModelKey.asr("en"), ModelKey.tts("es")
    args = [MtInput("hello")]
    assert check_outputs(mt, args, ["hola"]) == ["hola"]
    for bad in ([], ["hola", "x"], [None], ["\x00bad"], ["x" * 500]):
        with pytest.raises(MalformedOutput):
            check_outputs(mt, args, bad)
    audio = AsrInput(np.zeros(16000, dtype=np.float32))
    assert check_outputs(asr, [audio], [AsrOutput("hi", 0.9)]) == [AsrOutput("hi", 0.9)]
    for bad_asr in ([AsrOutput("hi", math.nan)], [AsrOutput("hi", 1.5)], [("hi", 0.9)], [AsrOutput("\ufffd", 0.5)]):
        with pytest.raises(MalformedOutput):
            check_outputs(asr, [audio], bad_asr)
    with pytest.raises(MalformedOutput):
        check_outputs(tts, ["hola"], [b"not a wav"])
    with pytest.raises(MalformedOutput):
        check_outputs(ModelKey.vad(), [np.zeros(512)], [np.array([np.nan])])


def test_garbage_never_passes_the_check() -> None:
    rng = random.Random(1)
    audio = AsrInput(np.zeros(16000, dtype=np.float32))
    for key, args, good in ((ModelKey.mt("en", "es"), [MtInput("a")] * 3, ["b"] * 3),
                            (ModelKey.asr("de"), [audio] * 2, [AsrOutput("x", 0.5)] * 2)):
        for _ in range(50):
            with pytest.raises(MalformedOutput):
                check_outputs(key, args, garble(str(key), list(good), rng))


def test_faults_fire_on_their_fraction_after_n_batches() -> None:
    f = parse_fault({"model": "asr", "kind": "error", "fraction": 0.5, "after": 10})
    faults = {"a": f}
    rng = random.Random(0)
    fired = [pick(faults, "asr:tiny.en", rng) is not None for _ in range(1010)]
    assert not any(fired[:10]) and 400 < sum(fired) < 600
    assert pick(faults, "mt:en-es", rng) is None  # other models untouched
    assert parse_fault({"kind": "hang"}).delay_s == 60.0
    from lingua_fusion.serving.faults import delay_of

    jittery = parse_fault({"delay_s": 0.5, "jitter_s": 0.2})
    delays = [delay_of(jittery, rng) for _ in range(2000)]
    assert min(delays) >= 0.5 and 0.65 < sum(delays) / len(delays) < 0.75  # 0.5 s + exponential, mean 0.2 s
    with pytest.raises(InvalidParameter):
        parse_fault({"after": -1})
