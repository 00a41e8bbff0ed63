"""Streams sharded over worker processes (``serve --workers 2``) feeding one model process: the same finals as one
process, admission across workers, and a model process killed mid-stream."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import jiwer
import numpy as np
import pytest
from conftest import free_port, start_server, stop_server, talk_wav
from test_streaming import SENTENCES, _norm, pcm16

from lingua_fusion import MultimodalTranslator
from lingua_fusion.config import Settings
from lingua_fusion.errors import BackendError, ModelTimeout, Overloaded
from lingua_fusion.glossary import Term
from lingua_fusion.models.registry import Registry
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, CallContext, MtInput
from lingua_fusion.serving.scheduler import Demand
from lingua_fusion.serving.shard import codec
from lingua_fusion.serving.shard.model_process import ModelServer
from lingua_fusion.serving.shard.remote import ModelLink, ModelProcessLost, RemotePort

OTHER = ["The train to the airport leaves every hour.", "Our team will present the results on Monday.",
         "Thank you all for coming today."]
Final = tuple[float, float, str, str]


@pytest.fixture(scope="module")
def talks(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    return [pcm16(talk_wav(SENTENCES)), pcm16(talk_wav(OTHER))]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("sharded")
    url, proc = start_server(state, "--no-auth", "--workers", "2", port=18810)
    yield url, state
    stop_server(proc)
    assert proc.returncode == 0  # the supervisor drained its workers and ended the model process


async def _finals(url: str, audio: bytes) -> list[Final]:
    async with MultimodalTranslator(base_url=url).stream(["es"], partials=False, slo="batch") as s:
        await s.send_audio(audio, ts=0.0)
        await s.end()
        return [(e.start, e.end, e.source_text or "", e.text or "") async for e in s if e.type == "final"]


async def _finals_when_admitted(url: str, audio: bytes, within_s: float = 20.0) -> list[Final]:
    """``_finals``, retried after a refusal as a client honouring ``retry_after`` would, for ``within_s``: streams
    that just ended may hold their reservations a moment longer on a loaded machine; a leaked one never frees."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        try:
            return await _finals(url, audio)
        except Overloaded:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(1.0)


async def test_sharded_and_single_process_give_the_same_finals(sharded: tuple[str, Path], talks: list[bytes],
                                                               tmp_path: Path) -> None:
    single_url, proc = start_server(tmp_path, "--no-auth", port=18811)
    try:
        one = [await _finals(single_url, audio) for audio in talks]
    finally:
        stop_server(proc)
    url, _ = sharded
    # the same streams, two at a time on the sharded server (one per worker where the kernel spreads them)
    many = await asyncio.gather(*(_finals(url, audio) for audio in talks))
    assert list(many) == one
    # /metrics on either worker counts every process's captions; CPU is the whole server's
    metrics = (await asyncio.to_thread(httpx.get, url + "/metrics", timeout=10)).text
    assert _sum(metrics, "linguafusion_caption_latency_seconds_count") == sum(len(f) for f in many)
    assert _sum(metrics, "process_cpu_seconds_total") > 0
    assert len(SENTENCES) <= len(one[0]) <= len(SENTENCES) + 2
    assert jiwer.wer(_norm(" ".join(SENTENCES)), _norm(" ".join(f[2] for f in one[0]))) <= 0.15


def _sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{", 1)[0].split(" ", 1)[0] == name)


def _pids(state: Path) -> dict[str, object]:
    return json.loads((state / "serve.json").read_text())


async def test_model_process_killed_mid_stream_then_the_server_recovers(sharded: tuple[str, Path],
                                                                        talks: list[bytes]) -> None:
    url, state = sharded
    before = _pids(state)
    audio = talks[0]
    chunk = 16000 * 2 // 2  # 0.5 s of PCM16
    events = []
    # with partials (tentative work in flight too); the batch class, so admission does not depend on how busy the
    # shared test machine made the learned model costs
    async with MultimodalTranslator(base_url=url).stream(["es"], slo="batch") as s:
        for i in range(0, len(audio), chunk):
            await s.send_audio(audio[i:i + chunk], ts=i / 32000)
            if i == 6 * chunk:  # 3 s in: the first utterance is being committed
                os.kill(int(before["model"]), signal.SIGKILL)  # type: ignore[call-overload]
            await asyncio.sleep(0.25)
        await s.end()
        events = [e async for e in s]
    finals = [e for e in events if e.type == "final"]
    assert events[-1].type == "closed"
    assert [f.seq for f in finals] == list(range(1, len(finals) + 1))  # gap-free: none lost, none twice
    # each committed caption is either transcribed by the model process's successor or says it failed
    failed = [(f.model_extra or {}).get("failed") for f in finals]
    assert all(f.source_text or bad for f, bad in zip(finals, failed, strict=True))
    kept = " ".join(f.source_text or "" for f, bad in zip(finals, failed, strict=True) if not bad)
    assert "project" in kept.lower()  # the words spoken after the restart are transcribed
    for _ in range(300):  # the supervisor has started a successor (at most 60 s)
        if _pids(state)["model"] != before["model"]:
            break
        await asyncio.sleep(0.2)
    after = _pids(state)
    assert after["model"] != before["model"] and after["workers"] == before["workers"]
    fresh = await _finals(url, talks[1])  # a new stream after the restart: served whole
    assert jiwer.wer(_norm(" ".join(OTHER)), _norm(" ".join(f[2] for f in fresh))) <= 0.15
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:  # the dead process's gauges left with it
        text = (await http.get("/metrics")).text
    assert f'pid="{after["model"]}"' in text and f'pid="{before["model"]}"' not in text


# ---- one level down: the wire and the model process's admission, over a real Unix socket, no models run ----
def test_codec_round_trips_the_payloads_and_typed_errors() -> None:
    audio = np.linspace(-1, 1, 16000, dtype=np.float32)
    msg = {"op": "run", "payload": [AsrInput(audio, "slide words"), MtInput("bank", (Term("bank", "orilla"),)),
                                    AsrOutput("hi", 0.9)],
           "demand": Demand("s1", "standard", {ModelKey.mt("en", "es"): 0.3})}
    frame = codec.encode(msg)
    back = codec.decode(frame[4:])
    asr, mt, out = back["payload"]
    assert np.array_equal(asr.audio, audio) and asr.audio.dtype == np.float32 and asr.prompt == "slide words"
    assert len(frame) < audio.nbytes + 400  # raw float32 bytes, a small header
    assert mt == MtInput("bank", (Term("bank", "orilla"),)) and isinstance(mt.glossary, tuple)
    assert out == AsrOutput("hi", 0.9) and back["demand"] == Demand("s1", "standard", {ModelKey.mt("en", "es"): 0.3})
    err = codec.error_of(codec.error_to_wire(Overloaded("full", retry_after=3.0)))
    assert isinstance(err, Overloaded) and err.retry_after == 3.0
    assert isinstance(codec.error_of(codec.error_to_wire(ModelTimeout("slow"))), ModelTimeout)
    assert type(codec.error_of({"cls": "SystemExit", "message": "x"})) is BackendError  # only our errors
    with pytest.raises(TypeError):
        codec.encode({"payload": object()})
    with pytest.raises(ValueError):
        codec.decode(codec.encode({"x": {"__t": "Popen", "args": "ls"}})[4:])


def test_an_image_at_the_pixel_limit_crosses_the_wire() -> None:
    """A slide as large as a client may send (limits.max_image_pixels) reaches OCR in the model process: under
    ``serve --workers`` a 36 MP slide was 'not read' (the frame bound was 64 MiB) where one process read it."""
    from lingua_fusion.config import LimitSettings

    side = int(LimitSettings().max_image_pixels ** 0.5)
    image = np.zeros((side, side, 3), dtype=np.uint8)
    image[::97, ::89] = 255
    back = codec.decode(codec.encode({"op": "run", "payload": image})[4:])["payload"]
    assert back.shape == image.shape and back.dtype == np.uint8 and np.array_equal(back, image)


async def _model_server(path: str, settings: Settings) -> tuple[ModelServer, asyncio.Server]:
    server = ModelServer(settings, Registry(settings))
    return server, await asyncio.start_unix_server(server.handle, path=path)


async def test_a_stream_refused_while_the_model_process_is_down_is_counted_as_unavailable(tmp_path: Path) -> None:
    """A worker whose model process is not there (restarting) refuses a new stream with ``overloaded`` (4429, retry
    shortly), counted on /metrics as ``streams_unavailable``, not as a refusal for room (before, it was not counted
    at all, so a restart's refusals were invisible to an operator)."""
    from lingua_fusion.observability import Metrics
    from lingua_fusion.stream.service import Principal, StreamService
    from lingua_fusion.stream.supervisor import BreakerSupervisor

    settings = Settings()
    settings.state_dir = tmp_path
    metrics = Metrics()
    link = ModelLink(str(tmp_path / "nobody.sock"), connect_wait_s=0.2)  # no model process listens there
    breakers = BreakerSupervisor(settings, metrics)
    service = StreamService(RemotePort(link, Registry(settings), settings, observer=breakers), settings,
                            supervisor=breakers, metrics=metrics)
    start = {"type": "start", "source_lang": "en", "target_langs": ["es"], "inputs": ["text"]}
    try:
        with pytest.raises(Overloaded, match="restarting"):
            await service.open(start, Principal("k1"))
        assert metrics.registry.get_sample_value("linguafusion_streams_unavailable_total") == 1
        assert metrics.registry.get_sample_value("linguafusion_streams_rejected_total") == 0
        assert service.quota.open.get("k1", 0) == 0  # nothing held by the refused open
    finally:
        await link.close()


async def test_a_key_cap_refusal_in_the_model_process_is_counted(tmp_path: Path) -> None:
    """Under ``serve --workers`` the key's cap is kept in the model process: its refusal counts on /metrics (the
    model process's counters are summed into every worker's page) as admission's own refusals do."""
    from lingua_fusion.observability import Metrics

    settings = Settings()
    settings.state_dir = tmp_path
    settings.server.max_streams_per_key = 1
    metrics = Metrics()
    path = str(tmp_path / "m.sock")
    server = ModelServer(settings, Registry(settings), metrics)
    listener = await asyncio.start_unix_server(server.handle, path=path)
    link = ModelLink(path)
    port = RemotePort(link, Registry(settings), settings)
    try:
        await port.reserve(port.demand("s1", "standard", "en", ["es"], True, 0.5, ["audio"]), "k1")
        with pytest.raises(Overloaded, match="too many open streams"):
            await port.reserve(port.demand("s2", "standard", "en", ["es"], True, 0.5, ["audio"]), "k1")
        assert metrics.registry.get_sample_value("linguafusion_streams_rejected_total") == 1
    finally:
        await link.close()
        listener.close()
        await server.close()


async def _one_worker(tmp_path: Path) -> tuple[ModelServer, asyncio.Server, ModelLink, RemotePort]:
    """A model process's server on a socket in ``tmp_path`` and one worker's link and port to it."""
    settings = Settings()
    settings.state_dir = tmp_path
    path = str(tmp_path / "m.sock")
    server, listener = await _model_server(path, settings)
    link = ModelLink(path)
    return server, listener, link, RemotePort(link, Registry(settings), settings)


def _ctx(stream: str) -> CallContext:
    return CallContext(stream, "standard", key_id="k1")


async def test_admission_and_key_quota_hold_across_workers(tmp_path: Path) -> None:
    settings = Settings()
    settings.state_dir = tmp_path
    settings.server.max_streams_per_key = 2
    path = str(tmp_path / "m.sock")
    server, listener = await _model_server(path, settings)
    links = [ModelLink(path), ModelLink(path)]  # two workers
    a, b = (RemotePort(link, Registry(settings), settings) for link in links)
    try:
        await a.reserve(a.demand("s1", "standard", "en", ["es"], True, 0.5, ["audio"]), "k1")
        await b.reserve(b.demand("s2", "standard", "en", ["es"], True, 0.5, ["audio"]), "k1")
        with pytest.raises(Overloaded, match="too many open streams"):  # the key's third stream, on either worker
            await a.reserve(a.demand("s3", "standard", "en", ["es"], True, 0.5, ["audio"]), "k1")
        await b.reserve(b.demand("s4", "standard", "en", ["es"], True, 0.5, ["audio"]), "k2")  # another key
        assert set(server.engine("batched").scheduler.admitted) == {"s1", "s2", "s4"}
        await links[1].close()  # worker b ends: its streams are released there
        for _ in range(100):
            if set(server.engine("batched").scheduler.admitted) == {"s1"}:
                break
            await asyncio.sleep(0.02)
        assert set(server.engine("batched").scheduler.admitted) == {"s1"}
        assert server.keys.open == {"k1": 1, "k2": 0}
        a.release("s1")
        await a.reserve(a.demand("s5", "standard", "en", ["es"], True, 0.5, ["audio"]), "k1")

        # the model process is replaced: worker a re-registers its live stream with the successor
        listener.close()
        os.unlink(path)
        successor, listener = await _model_server(path, settings)
        links[0]._outbox.writer.close()  # type: ignore[union-attr]  # the old process's socket ends
        for _ in range(250):
            if "s5" in successor.engine("batched").scheduler.admitted:
                break
            await asyncio.sleep(0.02)
        assert set(successor.engine("batched").scheduler.admitted) == {"s5"}
        assert successor.keys.open == {"k1": 1}
    finally:
        await links[0].close()
        listener.close()
        await server.close()


async def test_requests_of_one_loop_turn_cross_in_one_frame_each_way(tmp_path: Path) -> None:
    """Many streams' requests written in one turn of a worker's loop leave as one frame (one write), the model
    process answers them in few frames, and every caller gets its own answer."""
    server, listener, link, port = await _one_worker(tmp_path)
    try:
        await link.wait_up(5)
        sent = link._outbox.frames  # type: ignore[union-attr]  # the handshake's
        # 24 + 3 streams: within what admission gives one Whisper lane at its prior cost (about 30 at "batch")
        demands = [port.demand(f"s{i}", "batch", "en", ["es"], False, 1.0, ["audio"]) for i in range(24)]
        await asyncio.gather(*(port.reserve(d, f"k{i % 3}") for i, d in enumerate(demands)))
        assert link._outbox.frames - sent == 1 and link._outbox.messages - sent == 24  # type: ignore[union-attr]
        assert set(server.engine("batched").scheduler.admitted) == {f"s{i}" for i in range(24)}
        assert server.keys.open == {"k0": 8, "k1": 8, "k2": 8}
        server.keys.limit = 9  # one more per key, then a typed refusal: answers are not mixed up
        more = [port.demand(f"t{i}", "batch", "en", ["es"], False, 1.0, ["audio"]) for i in range(6)]
        results = await asyncio.gather(*(port.reserve(d, f"k{i % 3}") for i, d in enumerate(more)),
                                       return_exceptions=True)
        assert [r is None for r in results] == [True] * 3 + [False] * 3, results
        assert all(isinstance(r, Overloaded) for r in results[3:])
    finally:
        await link.close()
        listener.close()
        await server.close()


async def test_a_workers_vad_runs_in_the_worker_and_no_message_crosses_for_it(tmp_path: Path,
                                                                              talks: list[bytes]) -> None:
    """Every audio message asks for VAD: with ``models.vad_in_workers`` (the default) the worker answers it on its
    own engine, and the model process, whose event loop and lock its GPU runners share, never hears of it. The
    speech probabilities are the model process's own."""
    from lingua_fusion.serving.shard.worker_vad import worker_vad

    server, listener, link, remote = await _one_worker(tmp_path)
    local = RemotePort(link, remote.registry, remote.settings, vad=worker_vad(remote.registry, remote.settings))
    try:
        await link.wait_up(5)
        assert link._outbox is not None
        audio = np.frombuffer(talks[0], np.int16)[:16000 * 2].astype(np.float32) / 32768
        sent = link._outbox.messages
        here = await local.run(ModelKey.vad(), audio, _ctx("s1"))
        assert link._outbox.messages == sent  # nothing crossed
        there = await remote.run(ModelKey.vad(), audio, _ctx("s1"))
        assert link._outbox.messages == sent + 1  # vad_in_workers off: one round trip per call
        assert isinstance(here, np.ndarray) and isinstance(there, np.ndarray)
        assert len(here) == 62 and here.max() > 0.5 and np.allclose(here, there, atol=1e-5)  # speech, heard alike
        assert local.depth(ModelKey.vad()) == 0
    finally:
        await local.close()  # closes the worker's own engine, and the link
        listener.close()
        await server.close()


async def test_a_partials_audio_crosses_through_the_workers_shared_ring_not_the_socket(tmp_path: Path,
                                                                                      talks: list[bytes]) -> None:
    """A partial's window is up to seconds of float32 audio, sent again with every partial: it crosses through the
    worker's ring (serving/shard/shm.py), which the model process mapped at the handshake, and is transcribed as
    the same audio inline is; its span is free again once the call has ended."""
    server, listener, link, port = await _one_worker(tmp_path)
    try:
        await link.wait_up(5)
        assert link.ring is not None and link._outbox is not None and link._outbox.ring is link.ring  # mapped
        audio = np.frombuffer(talks[0], np.int16)[:16000 * 4].astype(np.float32) / 32768  # the first sentence
        through_ring = await port.run(ModelKey.asr("en"), AsrInput(audio), _ctx("s1"))
        assert link.ring.bytes_in == audio.nbytes and link.ring.live() == 0
        link._outbox.ring = None  # the same call inline, as to a model process that could not map the ring
        inline = await port.run(ModelKey.asr("en"), AsrInput(audio), _ctx("s1"))
        assert link.ring.bytes_in == audio.nbytes  # nothing more went through it
        assert through_ring is not None and inline is not None
        assert through_ring.text == inline.text and "good morning" in through_ring.text.lower()
    finally:
        await link.close()
        listener.close()
        await server.close()


async def test_a_span_whose_call_gave_up_is_not_written_again_until_the_model_process_has_read_it(
        tmp_path: Path) -> None:
    """A call that timed out may still sit unread in the model process's socket (its loop busy): its span is not
    handed to the next call until a reply to a later call says its frame was decoded, so the model process never
    reads another call's audio in its place. A long call's span is free as soon as a later call is answered."""
    from lingua_fusion.serving.shard import shm

    seen: list[tuple[str, float]] = []
    later: list[asyncio.TimerHandle] = []

    async def busy_model(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        out, view = codec.Outbox(writer), None
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                for m in await codec.read_frames(reader, view):
                    if m.get("op") == "ping":
                        view = shm.View.open(m["ring"], shm.peer_pid(writer.get_extra_info("socket")))
                        out.put({"op": "ok", "id": m["id"], "value": os.getpid(), "ring": view is not None})
                        continue
                    payload = m["payload"]
                    assert isinstance(payload, np.ndarray)
                    seen.append((str(m["tag"]), float(payload[0])))
                    if m["tag"] == "long":  # a file's piece: answered a second later, the loop serving on
                        later.append(asyncio.get_running_loop().call_later(
                            1.0, out.put, {"op": "ok", "id": m["id"], "value": None}))
                        continue
                    await asyncio.sleep(0.5 if m["tag"] == "first" else 0.01)  # its loop busy: frames wait
                    out.put({"op": "ok", "id": m["id"], "value": None})

    path = str(tmp_path / "m.sock")
    listener = await asyncio.start_unix_server(busy_model, path=path)
    link = ModelLink(path)
    try:
        await link.wait_up(5)
        assert link.ring is not None
        first = asyncio.create_task(link.call({"op": "run", "tag": "first", "payload": np.zeros(16)}, 5))
        await asyncio.sleep(0.05)
        with pytest.raises(ModelTimeout):
            await link.call({"op": "run", "tag": "gave up", "payload": np.full(32768, 1.0, np.float32)}, 0.1)
        assert link.ring.live() == 1  # held: the model process has not read it yet
        await link.call({"op": "run", "tag": "next", "payload": np.full(32768, 2.0, np.float32)}, 5)
        await first
        assert seen == [("first", 0.0), ("gave up", 1.0), ("next", 2.0)]  # each read its own audio
        assert link.ring.live() == 0  # the replies after it freed it
        # a long call's span is free once any later call is answered: its frame was read long before its reply
        long = asyncio.create_task(link.call({"op": "run", "tag": "long", "payload": np.ones(32768, np.float32)}, 5))
        await asyncio.sleep(0.05)
        assert link.ring.live() == 1
        await link.call({"op": "run", "tag": "short", "payload": np.zeros(16)}, 5)
        assert link.ring.live() == 0 and not long.done()
        await long
    finally:
        for handle in later:
            handle.cancel()
        await link.close()
        listener.close()


async def test_a_worker_whose_ring_the_model_process_cannot_map_sends_its_arrays_inline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model process that cannot map the worker's ring (/proc hidden, another user) says so at the handshake; the
    worker then sends every array through the socket, and its calls are served as before."""
    from lingua_fusion.serving.shard import shm

    monkeypatch.setattr(shm.View, "open", classmethod(lambda cls, handle, peer: None))
    server, listener, link, port = await _one_worker(tmp_path)
    try:
        await link.wait_up(5)
        assert link.ring is not None and link._outbox is not None and link._outbox.ring is None
        audio = np.zeros(16000 * 2, np.float32)  # 128 KB: through the ring, had it been mapped
        assert await port.run(ModelKey.vad(), audio, _ctx("s1")) is not None
        assert link.ring.bytes_in == 0
    finally:
        await link.close()
        listener.close()
        await server.close()


async def test_in_flight_work_fails_typed_when_the_model_process_is_gone(tmp_path: Path) -> None:
    settings = Settings()
    settings.state_dir = tmp_path
    path = str(tmp_path / "m.sock")
    started = asyncio.Event()
    conns: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(writer)
        await codec.read_frame(reader)  # takes the request, then dies without answering
        started.set()
        writer.close()

    listener = await asyncio.start_unix_server(swallow, path=path)
    link = ModelLink(path, connect_wait_s=0.5)
    port = RemotePort(link, Registry(settings), settings)
    port.retries = 0
    try:
        with pytest.raises(ModelProcessLost) as lost:
            await port.run(ModelKey.mt("en", "es"), MtInput("hello"), _ctx("s1"))
        assert isinstance(lost.value, BackendError) and lost.value.code == "backend_unavailable"
        assert started.is_set()
        listener.close()  # the process is gone for good: its socket file too, and the link's new connection
        os.unlink(path)
        for w in conns:
            w.close()
        with pytest.raises(ModelProcessLost):  # nobody there: tentative work fails at once, no hang
            await port.run(ModelKey.mt("en", "es"), MtInput("hello"), CallContext("s1", tentative=True))
    finally:
        await link.close()


# ---- several model processes (--model-processes): the caps hold across them ----
def test_shared_ledger_holds_key_and_total_caps_across_model_processes(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from lingua_fusion.serving.shard.ledger import SharedLedger, drop_process

    path = tmp_path / "admitted.db"
    a, b = (SharedLedger(path, j, key_limit=2, total_limit=5) for j in range(2))
    a.take(("batched", "s1"), "k1")
    b.take(("batched", "s2"), "k1")
    with pytest.raises(Overloaded, match="too many open streams"):  # the key's third, on the other process
        a.take(("batched", "s3"), "k1")
    b.take(("batched", "s3"), "k2")
    a.take(("batched", "s4"), "k3")
    b.take(("batched", "s5"), "k3")
    with pytest.raises(Overloaded, match=r"no capacity .*\(server.max_streams is full\)"):  # the sixth stream
        a.take(("batched", "s6"), "k4")
    b.give(("batched", "s2"), "k1")
    a.take(("batched", "s6"), "k1")  # room again for k1, and in all
    assert (a.count("k1"), a.count()) == (2, 5)

    # process 1 dies: the supervisor forgets its streams at once (the server has room again before any successor)
    b.close()
    drop_process(path, 1)
    assert (a.count("k2"), a.count("k3"), a.count()) == (0, 1, 3)
    a.take(("batched", "s9"), "k2")
    a.give(("batched", "s9"), "k2")
    # ... and its successor starts: its workers re-register their streams (force: never refused)
    b = SharedLedger(path, 1, key_limit=2, total_limit=5)
    assert (b.count("k1"), b.count("k2"), b.count()) == (2, 0, 3)
    b.take(("batched", "s3"), "k2", force=True)
    b.take(("batched", "s5"), "k3", force=True)
    assert b.count() == 5
    a.give(("batched", "s5"), "k3")  # not a's stream: a cannot release another process's row
    assert b.count("k3") == 2

    # many admissions at once from both processes (threads): never more than the key's cap
    for ledger in (a, b):
        for s in ("s1", "s3", "s4", "s5", "s6"):
            ledger.give(("batched", s), "")
    assert a.count() == 0
    many = [SharedLedger(path, 2 + j, key_limit=2, total_limit=5) for j in range(8)]  # 8 more processes
    won = []

    def admit(i: int) -> None:
        with contextlib.suppress(Overloaded):
            many[i % 8].take(("batched", f"r{i}"), "hot")
            won.append(i)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(admit, range(40)))
    assert len(won) == 2 and a.count("hot") == 2
    for ledger in (a, b, *many):
        ledger.close()


def test_pool_memory_is_split_evenly_between_model_processes() -> None:
    from lingua_fusion.serving.gpu.memory import share_budget

    gib = 1 << 30
    assert share_budget(100 * gib, 140 * gib, 0.8) == 80 * gib  # one process: 0.8 of what is free
    # four processes starting together: each at most a quarter of 0.8 of the total, whatever it saw free
    first = share_budget(130 * gib, 140 * gib, 0.8, share=0.25)
    later = share_budget(130 * gib - 2 * first, 140 * gib, 0.8, share=0.25)
    assert first == later == int(140 * gib * 0.8 * 0.25)
    assert share_budget(10 * gib, 140 * gib, 0.8, share=0.25) == 8 * gib  # less free than its share: what is free


def test_a_supervisor_removes_the_run_directories_of_supervisors_killed_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor killed with SIGKILL leaves its run directory (model sockets, metrics files, ledger) behind; the
    next one removes those whose supervisor is gone, and no other."""
    import subprocess
    import tempfile

    from lingua_fusion.api.workers import OWNER_FILE, Supervisor

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    dirs = {name: tmp_path / f"linguafusion-{name}" for name in ("stale", "live", "unowned")}
    for d in dirs.values():
        (d / "metrics").mkdir(parents=True)
    (dirs["stale"] / OWNER_FILE).write_text(str(gone.pid))
    (dirs["live"] / OWNER_FILE).write_text(str(os.getpid()))
    sup = Supervisor(Settings(), 2)
    assert not dirs["stale"].exists() and dirs["live"].exists() and dirs["unowned"].exists()
    assert Path(sup.run_dir).parent == tmp_path and (Path(sup.run_dir) / OWNER_FILE).read_text() == str(os.getpid())


def test_model_processes_share_the_gpu_pools_and_the_cpu_threads() -> None:
    import shutil

    from lingua_fusion.api.workers import Supervisor

    settings = Settings()
    settings.models.asr_threads = 2
    sup = Supervisor(settings, 4, model_processes=2)
    try:
        m = sup.settings.models
        assert (m.gpu_memory_share, m.asr_threads) == (0.5, 1)  # two CPU Whisper processes: a thread each
        assert len(sup.paths) == 2 and sup.ledger is not None
        assert settings.models.asr_threads == 2  # the caller's settings are not changed
    finally:
        shutil.rmtree(sup.run_dir)
    settings.models.gpu_memory_share = 0.5  # an operator's own share is split, not replaced
    sup = Supervisor(settings, 2, model_processes=2)
    shutil.rmtree(sup.run_dir)
    assert sup.settings.models.gpu_memory_share == 0.25
    with pytest.raises(ValueError):
        Supervisor(settings, 2, model_processes=3)


async def test_two_model_processes_serve_streams_and_one_recovers_from_a_kill(talks: list[bytes],
                                                                              tmp_path: Path) -> None:
    env = {"LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY": "3"}
    url, proc = start_server(tmp_path, "--no-auth", "--workers", "2", "--model-processes", "2", env=env)
    try:
        pids = _pids(tmp_path)
        assert len(pids["models"]) == 2 and len(set(pids["models"])) == 2
        assert pids["restarts"] == 0  # a fresh state directory: no worker tripped over another opening it
        # ps and top (and bench/gpu_serve.py's CPU by role) tell the processes apart by name, once each has started
        # (a worker spawned a moment ago may still be importing)
        procs = [*pids["models"], *pids["workers"]]  # type: ignore[misc]
        for _ in range(150):
            names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in procs]
            if all(n.startswith("lf-") for n in names):
                break
            await asyncio.sleep(0.2)
        assert names == ["lf-model-0", "lf-model-1", "lf-worker", "lf-worker"]
        finals = await asyncio.gather(*(_finals(url, talks[i % 2]) for i in range(3)))
        for i, f in enumerate(finals):
            script = SENTENCES if i % 2 == 0 else OTHER
            assert jiwer.wer(_norm(" ".join(script)), _norm(" ".join(x[2] for x in f))) <= 0.15
        # the key's cap (3) holds across both model processes: a fourth concurrent stream is refused
        async with contextlib.AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(MultimodalTranslator(base_url=url).stream(["es"], slo="batch"))
                       for _ in range(3)]
            with pytest.raises(Overloaded):
                async with MultimodalTranslator(base_url=url).stream(["es"], slo="batch"):
                    pass
            for s in streams:  # ended and read to "closed": their reservations are given back, not kept for a resume
                await s.end()
                assert [e.type async for e in s][-1] == "closed"
        os.kill(int(pids["models"][1]), signal.SIGKILL)
        for _ in range(300):
            now = _pids(tmp_path)
            if now["models"][1] not in (None, pids["models"][1]):
                break
            await asyncio.sleep(0.2)
        assert now["models"][0] == pids["models"][0] and now["models"][1] != pids["models"][1]
        again = await asyncio.gather(*(_finals_when_admitted(url, talks[0]) for _ in range(2)))  # both serve again
        for f in again:
            assert jiwer.wer(_norm(" ".join(SENTENCES)), _norm(" ".join(x[2] for x in f))) <= 0.15
    finally:
        stop_server(proc)
    assert proc.returncode == 0
    assert not (tmp_path / "serve.json").exists()  # no pids left behind for whoever gets them next


async def test_a_sigterm_to_the_whole_process_group_still_drains_the_streams(talks: list[bytes],
                                                                              tmp_path: Path) -> None:
    """systemd's default KillMode (or ``kill -TERM -- -PGID``) signals every process of the server at once. The
    model process serves the workers' drain until they hang up, and the Apertium processes it keeps are not in the
    group, so speech sent right before the signal still gets its translated final before the stream closes for a
    restart (before, the model process ended at once: the drain's request failed and the caption never came), and
    the server logs no traceback on the way out."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    port = free_port()
    url, proc = start_server(tmp_path, "--no-auth", "--workers", "2", port=port, new_session=True)
    events: list[dict[str, object]] = []
    try:
        async with connect(url.replace("http", "ws") + "/v1/streams", max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "target_langs": ["es"], "partials": True}))
            assert json.loads(await ws.recv())["type"] == "ready"
            await ws.send(pcm16(talk_wav(SENTENCES[:1])))
            while True:  # the server has the speech (its first partial): the final's model work is still ahead
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
                if events[-1]["type"] in ("partial", "final"):
                    break
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(ConnectionClosed):
                async for m in ws:
                    if isinstance(m, str):
                        events.append(json.loads(m))
            assert ws.close_code == 1012  # told to reconnect: the server is restarting
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        if proc.poll() is None:
            stop_server(proc)
    finals = [e for e in events if e["type"] == "final"]
    assert len(finals) == 1 and "quarterly review" in _norm(str(finals[0]["source_text"])), events
    assert finals[0]["text"]
    log = (tmp_path / f"server-{port}.log").read_text()
    assert "Traceback" not in log and "failed" not in log, log


async def _one_stream_per_key(tmp_path: Path) -> tuple[str, ModelServer, asyncio.Server, Demand]:
    """A model process that lets a key have one stream, and the demand of a stream ``s1``."""
    settings = Settings()
    settings.state_dir = tmp_path
    settings.server.max_streams_per_key = 1
    path = str(tmp_path / "m.sock")
    server, listener = await _model_server(path, settings)
    demand = RemotePort(ModelLink(path), Registry(settings), settings).demand("s1", "standard", "en", ["es"], False,
                                                                                1.0, ["audio"])
    return path, server, listener, demand


async def test_a_release_right_behind_its_admit_frees_the_reservation(tmp_path: Path) -> None:
    """A worker that admits a stream and releases it at once (the client left while its start was being admitted):
    both arrive in one read, and the model process applies them in order, so no reservation (nor a count against
    the key) stays behind for the rest of the worker's connection."""
    path, server, listener, demand = await _one_stream_per_key(tmp_path)
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(codec.encode({"op": "admit", "id": 1, "mode": "batched", "demand": demand, "key_id": "k1"})
                     + codec.encode({"op": "release", "mode": "batched", "stream_id": "s1"})
                     + codec.encode({"op": "ping", "id": 2}))
        replies: dict[int, dict[str, object]] = {}
        while len(replies) < 2:
            for m in await asyncio.wait_for(codec.read_frames(reader), 5):
                replies[int(m["id"])] = m
        assert replies[1]["op"] == "ok"
        assert server.owners == {} and "s1" not in server.engine("batched").scheduler.admitted
        assert server.keys.open.get("k1", 0) == 0  # the key may open its one stream again
    finally:
        writer.close()
        listener.close()
        await server.close()


def test_a_locked_ledger_refuses_a_stream_typed_and_a_release_is_not_lost(tmp_path: Path) -> None:
    """The ledger's file held by a wedged transaction elsewhere: an admission is a typed refusal (429 / 4429 with
    retry_after, not an untyped error the model process cannot answer), a release neither raises (it runs in the
    model process's read loop) nor is forgotten: its row goes once the file is free again."""
    import sqlite3

    from lingua_fusion.serving.shard.ledger import SharedLedger

    path = tmp_path / "admitted.db"
    ledger = SharedLedger(path, 0, key_limit=1, total_limit=5, busy_ms=50)
    ledger.take(("batched", "s1"), "k1")
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another model process, wedged mid-transaction
    with pytest.raises(Overloaded) as refused:
        ledger.take(("batched", "s2"), "k2")
    assert refused.value.retry_after > 0
    ledger.give(("batched", "s1"), "k1")  # cannot write now: kept, not raised
    other.execute("ROLLBACK")
    other.close()
    ledger.take(("batched", "s3"), "k1")  # k1's one stream ended: the key may open another
    assert (ledger.count("k1"), ledger.count()) == (1, 1)
    ledger.close()


async def test_the_model_process_runs_as_many_requests_as_a_worker_link_lets_through(tmp_path: Path) -> None:
    """A worker's link lets 8 requests per admitted stream be in flight (600 streams: 4,800); the model process
    must not refuse the ones past its own fixed bound (4,096) with 'the model process is full' (a committed caption
    refused so fails its final: RemotePort retries only a lost model process)."""
    from lingua_fusion.serving.shard.remote import link_in_flight

    settings = Settings()
    settings.state_dir = tmp_path
    settings.server.max_streams = 600
    path = str(tmp_path / "m.sock")
    server, listener = await _model_server(path, settings)
    n = link_in_flight(settings) - 100
    assert n > 4096
    reader, writer = await asyncio.open_unix_connection(path, limit=codec.MAX_FRAME)
    try:
        out = codec.Outbox(writer)
        for i in range(n):  # one turn of the loop: one frame, all read before any of them runs
            out.put({"op": "run", "id": i + 1, "key": "nonsense", "mode": "batched", "payload": None, "ctx": {}})
        replies: list[dict[str, object]] = []
        while len(replies) < n:
            replies += await asyncio.wait_for(codec.read_frames(reader), 10)
        full = [r for r in replies if "is full" in str(r.get("error", {}))]
        assert not full and all(r["op"] == "err" for r in replies)  # each one answered (a bad key), none refused
    finally:
        writer.close()
        listener.close()
        await server.close()


async def test_an_old_sessions_release_does_not_free_the_stream_resumed_on_another_worker(tmp_path: Path) -> None:
    """A client resumes its stream on another worker while its old session is still open on the first; when the old
    session ends, its release must not free the resumed stream's reservation (nor its count against the key)."""
    path, server, listener, demand = await _one_stream_per_key(tmp_path)
    conns = [await asyncio.open_unix_connection(path) for _ in range(2)]  # two workers
    admit = {"op": "admit", "mode": "batched", "demand": demand, "key_id": "k1"}

    async def ask(j: int, msg: dict[str, object]) -> dict[str, object]:
        conns[j][1].write(codec.encode(msg))
        return await asyncio.wait_for(codec.read_frame(conns[j][0]), 5)

    try:
        assert (await ask(0, {**admit, "id": 1}))["op"] == "ok"
        assert (await ask(1, {**admit, "id": 2}))["op"] == "ok"  # resumed on the second worker
        conns[0][1].write(codec.encode({"op": "release", "mode": "batched", "stream_id": "s1"}))  # the old one ends
        await ask(0, {"op": "ping", "id": 3})  # the release was read before this
        assert "s1" in server.engine("batched").scheduler.admitted and server.keys.open["k1"] == 1
        other = dataclasses.replace(demand, stream_id="s2")
        refused = await ask(0, {**admit, "id": 4, "demand": other})  # the key's one stream is still open
        assert refused["op"] == "err" and refused["error"]["cls"] == "Overloaded"  # type: ignore[index]
        conns[1][1].write(codec.encode({"op": "release", "mode": "batched", "stream_id": "s1"}))
        await ask(1, {"op": "ping", "id": 5})
        assert server.owners == {} and server.keys.open["k1"] == 0
    finally:
        for _, w in conns:
            w.close()
        listener.close()
        await server.close()


async def test_a_model_process_that_never_answers_an_admission_refuses_the_stream_as_overloaded(
        tmp_path: Path) -> None:
    """A wedged model process (it took the connection and the handshake, then stopped: SIGSTOP, a native deadlock)
    refuses a new stream as a full server would, ``overloaded`` with retry_after (4429), not ``model_timeout``,
    which a client saw as a server error (1011); the release is sent behind it, so the admit frees nothing twice
    nor leaves a reservation once the process answers again."""
    path = str(tmp_path / "m.sock")
    seen: list[str] = []

    async def wedged(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await codec.read_frame(reader)
        writer.write(codec.encode({"op": "ok", "id": hello["id"], "value": 1, "depth": 0}))
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # reads what comes, answers nothing
                seen.extend(str(m.get("op")) for m in await codec.read_frames(reader))

    listener = await asyncio.start_unix_server(wedged, path=path)
    settings = Settings()
    settings.state_dir = tmp_path
    link = ModelLink(path, connect_wait_s=0.2)
    port = RemotePort(link, Registry(settings), settings)
    try:
        with pytest.raises(Overloaded) as refused:
            await port.reserve(port.demand("s1", "standard", "en", ["es"], True, 0.5, ["audio"]), "k1")
        assert refused.value.retry_after > 0 and refused.value.code == "overloaded"
        assert ("batched", "s1") not in link.admitted
        for _ in range(100):
            if "release" in seen:
                break
            await asyncio.sleep(0.02)
        assert seen == ["admit", "release"]
    finally:
        await link.close()
        listener.close()


def test_a_lone_surrogate_is_refused_where_client_json_enters() -> None:
    """"\\ud800" is a valid JSON escape but no character: it used to pass the parser and fail later (SQLite: a 500 on
    POST /v1/glossaries, /v1/keys, /v1/vocabularies; the model wire's msgpack: a stream's text message killed its
    caption emitter under ``serve --workers``). A surrogate pair is one character and passes."""
    from lingua_fusion import glossary, strict_json
    from lingua_fusion.errors import InvalidParameter

    assert strict_json.loads('{"t": "\\ud83d\\ude00"}') == {"t": "\U0001f600"}
    assert strict_json.loads('{"t": "\\\\ud800"}') == {"t": "\\ud800"}  # an escaped backslash, not a surrogate
    for raw in ('{"t": "a\\ud800b"}', b'["\\uDFFF"]', '{"t": NaN}'):
        with pytest.raises(ValueError):
            strict_json.loads(raw)
    with pytest.raises(InvalidParameter):
        glossary.parse(b'{"bank": "orilla\\ud800"}', max_terms=10)
    with pytest.raises(UnicodeEncodeError):  # what the model wire did with it (codec.Outbox.put)
        codec.encode({"op": "run", "payload": MtInput("Hello \ud800 world")})


async def test_a_text_message_with_a_lone_surrogate_is_refused_on_a_sharded_server(sharded: tuple[str, Path]) -> None:
    """On ``serve --workers 2`` a text message holding "\\ud800" is refused (invalid_parameter, 4400) with the
    captions already sent intact, and the worker goes on serving streams; before, the stream's emitter died on the
    model wire and the stream closed 1000 without ``closed``, its later captions lost."""
    import websockets

    url, _state = sharded
    ws_url = url.replace("http", "ws", 1) + "/v1/streams"
    async with websockets.connect(ws_url, open_timeout=30) as ws:
        await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "inputs": ["text"]}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] == "ready"
        await ws.send(json.dumps({"type": "text", "text": "The river is calm.", "ts": 1.0}))
        await ws.send('{"type": "text", "text": "Hello \\ud800 world.", "ts": 2.0}')
        events = []
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 120)))
        assert ws.close_code == 4400, events
    assert [e["code"] for e in events if e["type"] == "error"] == ["invalid_parameter"]
    async with websockets.connect(ws_url, open_timeout=30) as ws:  # the worker still serves a stream whole
        await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "inputs": ["text"]}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] == "ready"
        await ws.send(json.dumps({"type": "text", "text": "The river is calm.", "ts": 1.0}))
        await ws.send(json.dumps({"type": "end"}))
        events = [json.loads(m) async for m in ws]
    assert [e["type"] for e in events if e["type"] in ("final", "closed")] == ["final", "closed"]
    assert events[-1]["finals"] == 1


async def test_a_payload_the_wire_cannot_carry_fails_that_call_typed_and_the_link_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OCR image over the wire's frame bound (a 40 MP slide is 120 MB as pixels, the frame bound 64 MiB) or a text
    that is not Unicode raised a bare ValueError out of the worker's port: the slide's OCR task died unobserved (no
    ``slide``, no ``error`` event, 'Task exception was never retrieved'), a final's emitter died with it. Now the
    call fails as a BackendError (a slide 'not read' error event, a final marked failed) and the link serves on."""
    server, listener, link, port = await _one_worker(tmp_path)
    monkeypatch.setattr(codec, "MAX_FRAME", 1024 * 1024)
    try:
        await link.wait_up(5)
        assert link._outbox is not None
        link._outbox.ring = None  # inline, as to a model process that could not map the worker's ring (shm.py)
        with pytest.raises(BackendError) as big:
            await port.run(ModelKey.ocr(), np.zeros((1000, 1000, 3), dtype=np.uint8), _ctx("s1"))
        assert not isinstance(big.value, ModelProcessLost)
        with pytest.raises(BackendError):
            await port.run(ModelKey.mt("en", "es"), MtInput("Hello \ud800 world"), _ctx("s1"))
        assert link.losses == 0
        assert await port.run(ModelKey.mt("en", "es"), MtInput("Good morning."), _ctx("s1"))  # the same link
    finally:
        await link.close()
        listener.close()
        await server.close()


async def test_rooms_without_a_shared_redis_are_refused_clearly_on_a_sharded_server(sharded: tuple[str, Path]
                                                                                     ) -> None:
    """Rooms kept in one worker's memory would be found by half the listeners (each request lands on any worker):
    without Redis, ``serve --workers`` makes none, by REST or by a stream started with ``"room": true``, and says
    why (501 not_configured); the stream service goes on."""
    import websockets

    url, _state = sharded
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(4):  # whichever worker answers
            r = await http.post("/v1/rooms", json={"source_lang": "en"})
            assert r.status_code == 501 and r.json()["error"]["code"] == "not_configured", r.text
            assert "LINGUAFUSION_STATE__REDIS_URL" in r.json()["error"]["message"]
    ws_url = url.replace("http", "ws", 1) + "/v1/streams"
    async with websockets.connect(ws_url, open_timeout=30) as ws:
        await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "inputs": ["text"],
                                  "room": True}))
        events = []
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
    assert [(e["type"], e.get("code")) for e in events] == [("error", "not_configured")], events
    assert await _finals_when_admitted(url, pcm16(talk_wav(OTHER[:1])))  # the key's reservation was given back


async def test_a_wedged_model_process_makes_the_workers_not_ready_until_it_answers_again(
        sharded: tuple[str, Path]) -> None:
    """/readyz under ``serve --workers`` asks the worker's model process too: SIGSTOPped, every worker answers 503
    with what is wrong (a balancer moves on); resumed, 200 again. /healthz (the process is alive) stays 200."""
    url, state = sharded
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        ready = (await http.get("/readyz")).json()
        assert ready["ready"] is True and ready["model_process"] == "ok"
        model = int(_pids(state)["model"])  # type: ignore[call-overload]
        os.kill(model, signal.SIGSTOP)
        try:
            for _ in range(4):  # whichever worker answers
                r = await http.get("/readyz")
                assert r.status_code == 503 and r.json()["ready"] is False, r.text
                assert r.json()["model_process"].startswith("model_timeout")
            assert (await http.get("/healthz")).status_code == 200
        finally:
            os.kill(model, signal.SIGCONT)
        r = await http.get("/readyz")
        assert r.status_code == 200 and r.json()["model_process"] == "ok"
