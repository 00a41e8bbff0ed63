"""OpenTelemetry traces: the span tree of a real file request and of real streams, collected with the SDK's
in-memory exporter from a real server (uvicorn on a port, real models, the SDK's WebSocket client); the same spans
exported over OTLP/HTTP to a receiver when ``LINGUAFUSION_OTEL__ENDPOINT`` is set; and with tracing off, no SDK
imported at all.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import SRC, free_port, render_slide, start_server, stop_server, talk_wav
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_streaming import SENTENCES, pcm16

from lingua_fusion import MultimodalTranslator
from lingua_fusion.api import create_app
from lingua_fusion.config import Settings
from lingua_fusion.errors import BackendError
from lingua_fusion.sdk.local import LocalTranslator
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import CallContext, MtInput
from lingua_fusion.tracing import Tracer, TraceRef, record_batch

L = "linguafusion."


class LiveApp:
    """create_app served by a real uvicorn on its own thread and event loop."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-tracing", daemon=True)

    def __enter__(self) -> LiveApp:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveApp, InMemorySpanExporter, str, str]]:
    """A real server whose tracer hands every span to an in-memory exporter; an API key (secret, key id)."""
    settings = Settings(state_dir=tmp_path_factory.mktemp("traced"))
    exporter = InMemorySpanExporter()
    app = create_app(settings, warm=False, tracer=Tracer.to_exporter(exporter, "linguafusion-test"))
    secret, key = app.state.store.create_key("tracing")
    with LiveApp(app) as live:
        yield live, exporter, secret, key.key_id


@pytest.fixture(scope="module")
def speech() -> bytes:
    return talk_wav(SENTENCES[:2])


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def attr(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {}).get(name if "." in name else L + name)


def no_secret(spans: list[ReadableSpan], secret: str) -> None:
    for s in spans:
        for v in (s.attributes or {}).values():
            assert secret not in str(v), (s.name, v)


def wait_for(exporter: InMemorySpanExporter, pred: Any, wait_s: float = 30.0) -> list[ReadableSpan]:
    """Spans end on other threads (a request's worker, the server's loop): wait until ``pred`` holds."""
    deadline = time.monotonic() + wait_s
    while True:
        spans = list(exporter.get_finished_spans())
        if pred(spans) or time.monotonic() > deadline:
            return spans
        time.sleep(0.05)


def test_file_request_is_one_trace_with_a_span_per_stage(traced: Any, speech: bytes) -> None:
    live, exporter, secret, key_id = traced
    exporter.clear()
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = httpx.post(live.url + "/v1/translate", headers={
        "Authorization": f"Bearer {secret}", "traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01"},
        files={"file": ("talk.wav", speech, "audio/wav")},
        data={"target_lang": "es", "source_lang": "en"}, timeout=120)
    assert r.status_code == 200, r.text
    assert "oficina" in r.json()["text"].lower()
    spans = wait_for(exporter, lambda ss: any(s.name == "POST /v1/translate" for s in ss))
    root = next(s for s in spans if s.name == "POST /v1/translate")
    assert root.context is not None and format(root.context.trace_id, "032x") == caller_trace  # the caller's trace
    assert attr(root, "http.route") == "/v1/translate" and attr(root, "http.response.status_code") == 200
    assert attr(root, "key_id") == key_id and attr(root, "route") == "apertium en->es"
    stages = children(spans, root)
    assert [s.name for s in stages] == ["decode", "asr", "mt"]
    for s in stages:  # inside the request, in order, on its trace
        assert s.context is not None and s.context.trace_id == root.context.trace_id
        assert root.start_time <= s.start_time <= s.end_time <= root.end_time  # type: ignore[operator]
    assert stages[0].end_time <= stages[1].start_time <= stages[1].end_time <= stages[2].start_time  # type: ignore[operator]
    assert root.resource.attributes["service.name"] == "linguafusion-test"
    no_secret(spans, secret)


def test_a_refused_request_is_traced_with_its_status(traced: Any) -> None:
    live, exporter, secret, _ = traced
    exporter.clear()
    r = httpx.post(live.url + "/v1/translate", headers={"Authorization": f"Bearer {secret}"},
                   data={"target_lang": "xx", "text": "hello"}, timeout=30)
    assert r.status_code == 400
    spans = wait_for(exporter, lambda ss: any(s.name == "POST /v1/translate" for s in ss))
    root = next(s for s in spans if s.name == "POST /v1/translate")
    assert attr(root, "http.response.status_code") == 400 and not children(spans, root)  # refused before any stage
    assert root.status.is_ok  # a client's mistake is not a server error
    httpx.get(live.url + "/healthz", timeout=10)
    assert not any("healthz" in s.name for s in wait_for(exporter, lambda ss: False, 0.3))  # probes: not traced


async def test_websocket_stream_spans_its_stages_and_journal_writes(traced: Any, speech: bytes) -> None:
    live, exporter, secret, key_id = traced
    exporter.clear()
    t = MultimodalTranslator(api_key=secret, base_url=live.url)
    finals = []
    async with t.stream(["es"], partials=False) as s:
        stream_id = s.ready["stream_id"]
        await s.send_audio(pcm16(speech), ts=0.0)
        await s.end()
        async for ev in s:
            if ev.type == "final":
                finals.append(ev)
    n = len(finals)
    assert n >= 2  # two sentences (a long pause inside one would make it two utterances)
    spans = await asyncio.to_thread(wait_for, exporter, lambda ss: any(s.name == "stream" for s in ss))
    root = next(s for s in spans if s.name == "stream")
    assert attr(root, "stream_id") == stream_id and attr(root, "key_id") == key_id
    assert attr(root, "slo") == "standard" and attr(root, "finals") == n and attr(root, "targets") == "es"
    assert root.parent is None  # the stream is a trace of its own
    kids = children(spans, root)
    names = {s.name for s in kids}
    assert names == {"vad", "asr", "mt", "journal.write"}, names
    assert root.context is not None and all(k.context and k.context.trace_id == root.context.trace_id for k in kids)
    asr = [k for k in kids if k.name == "asr"]
    mt = [k for k in kids if k.name == "mt"]
    assert len(asr) == n and len(mt) == n  # one per committed utterance (no partials asked)
    for k in asr + mt:  # a batched model call: the batch's times and what it was
        assert attr(k, "model_key") in ("asr:tiny.en", "mt:en-es") and attr(k, "batch_size") >= 1
        assert attr(k, "queue_wait_s") >= 0.0 and attr(k, "tentative") is False and attr(k, "batch_id") >= 1
    writes = sorted((k for k in kids if k.name == "journal.write"), key=lambda k: attr(k, "seq"))
    assert [attr(w, "seq") for w in writes] == list(range(1, n + 1)) and all(attr(w, "durable") is True for w in writes)
    assert all(attr(v, "model_key") == "vad" for v in kids if v.name == "vad")
    no_secret(spans, secret)


async def test_in_process_stream_spans_decode_ocr_mt_and_tts(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    translator = LocalTranslator(Settings(state_dir=tmp_path), tracer=Tracer.to_exporter(exporter))
    got: list[str] = []
    try:
        async with translator.stream(["es"], partials=False, speech=True, inputs=["image", "text"]) as s:
            stream_id = s.ready["stream_id"]
            await s.send_image(render_slide(["Quarterly review"]), ts=0.0)
            async for ev in s:  # the slide is read, then the text sent
                got.append(ev.type)
                if ev.type == "slide":
                    break
            await s.send_text("The house is very big.", ts=1.0)
            await s.end()
            async for ev in s:
                got.append(ev.type)
        await translator.close_streams()
    finally:
        translator.close()
    assert "slide" in got and "final" in got and "speech" in got
    spans = list(exporter.get_finished_spans())
    root = next(s for s in spans if s.name == "stream")
    assert attr(root, "stream_id") == stream_id and attr(root, "key_id") == "local"
    kids = children(spans, root)
    assert sorted(k.name for k in kids) == ["decode", "mt", "ocr", "tts"]  # no journal in-process
    decode = next(k for k in kids if k.name == "decode")
    assert attr(decode, "media") == "image" and attr(decode, "bytes") > 0
    ocr = next(k for k in kids if k.name == "ocr")
    assert attr(ocr, "tentative") is True and attr(ocr, "model_key") == "ocr"  # slides are shed first under load
    assert attr(next(k for k in kids if k.name == "tts"), "model_key") == "tts:es"


async def test_a_batch_is_recorded_once_per_item_under_each_items_own_stream() -> None:
    exporter = InMemorySpanExporter()
    tracer = Tracer.to_exporter(exporter)
    a = tracer.stream("st_a", "key_a", "standard", "en", ["es"])
    b = tracer.stream("st_b", "key_b", "interactive", "en", ["es"])
    now = time.monotonic()
    record_batch("mt:en-es", "mt", [(a, now - 0.30, False), (None, now - 0.2, False), (b, now - 0.25, True)],
                 now - 0.1, now)
    a.end()
    b.end()
    spans = list(exporter.get_finished_spans())
    for parent, wait, tentative in ((a, 0.2, False), (b, 0.15, True)):
        (item,) = [s for s in spans if s.name == "mt" and s.parent and s.parent.span_id == parent.span.context.span_id]
        assert attr(item, "batch_size") == 3 and attr(item, "tentative") is tentative
        assert abs(attr(item, "queue_wait_s") - wait) < 0.01
        assert abs((item.end_time - item.start_time) / 1e9 - 0.1) < 0.01  # type: ignore[operator]
    items = [s for s in spans if s.name == "mt"]
    assert len(items) == 2 and attr(items[0], "batch_id") == attr(items[1], "batch_id")  # siblings, found by id
    assert items[0].context and items[1].context and items[0].context.trace_id != items[1].context.trace_id
    tracer.shutdown()


async def test_the_executor_records_a_shared_batch_and_a_failed_call_under_each_stream() -> None:
    """The real Executor (a fake MT runner): three items of two streams queue behind a running batch and run as one
    batch of three; each item's span is under its own stream, with that batch's size, id and its queue wait. A
    failing call's span is marked with the error's code. An untraced item makes no span."""
    exporter = InMemorySpanExporter()
    tracer = Tracer.to_exporter(exporter)
    a = tracer.stream("st_a", "key_a", "standard", "en", ["es"])
    b = tracer.stream("st_b", "key_b", "standard", "en", ["es"])
    started, release = threading.Event(), threading.Event()
    batches: list[list[str]] = []

    def runner(items: list[MtInput]) -> list[str]:
        batches.append([it.text for it in items])
        if items[0].text == "fail":
            raise RuntimeError("the MT backend broke")
        started.set()
        release.wait(30)  # the first batch holds the worker while the traced items queue
        return [it.text.upper() for it in items]

    ex = Executor(None, Settings(), backends={"mt": lambda key: runner})  # type: ignore[arg-type]
    key = ModelKey.mt("en", "es")
    try:
        hold = asyncio.create_task(ex.run(key, MtInput("hold"), CallContext("st_x")))
        await asyncio.to_thread(started.wait, 30)
        queued = [asyncio.create_task(ex.run(key, MtInput(text), CallContext(sid, tentative=tent, trace=ref)))
                  for text, sid, tent, ref in (("one", "st_a", False, a), ("two", "st_a", False, a),
                                               ("three", "st_b", True, b))]
        for _ in range(3000):  # all three queued first (a busy CI loop ran the tasks late: a wait of 1 ms)
            if ex.depth(key) >= 3:
                break
            await asyncio.sleep(0.01)
        assert ex.depth(key) == 3
        await asyncio.sleep(0.05)  # then they wait at least this long behind the held batch
        release.set()
        assert await asyncio.gather(hold, *queued) == ["HOLD", "ONE", "TWO", "THREE"]
        with pytest.raises(BackendError):
            await ex.run(key, MtInput("fail"), CallContext("st_b", tentative=True, trace=b))
    finally:
        await ex.close()
    a.end()
    b.end()
    assert batches == [["hold"], ["one", "two", "three"], ["fail"]]
    spans = list(exporter.get_finished_spans())
    under = {name: [s for s in spans if s.name == "mt" and s.parent and s.parent.span_id == ref.span.context.span_id]
             for name, ref in (("a", a), ("b", b))}
    assert len(under["a"]) == 2 and len(under["b"]) == 2 and len([s for s in spans if s.name == "mt"]) == 4
    batch = under["a"] + [s for s in under["b"] if s.status.is_ok]
    assert {attr(s, "batch_size") for s in batch} == {3} and len({attr(s, "batch_id") for s in batch}) == 1
    assert all(attr(s, "queue_wait_s") >= 0.04 and attr(s, "model_key") == "mt:en-es" for s in batch)
    assert [attr(s, "tentative") for s in under["a"]] == [False, False]
    (failed,) = [s for s in under["b"] if not s.status.is_ok]
    assert attr(failed, "error.type") == "backend_unavailable" and "broke" not in (failed.status.description or "")


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: decodes each ExportTraceServiceRequest into (service name, span name) pairs."""

    received: list[tuple[str, str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            service = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
            for ss in rs.scope_spans:
                self.received.extend((self.path, service, s.name) for s in ss.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_spans_are_exported_over_otlp_http_when_the_endpoint_is_set(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    collector = ThreadingHTTPServer(("127.0.0.1", free_port()), Collector)
    receiving = threading.Thread(target=collector.serve_forever, daemon=True)
    receiving.start()
    try:
        monkeypatch.setenv("LINGUAFUSION_OTEL__ENDPOINT", f"http://127.0.0.1:{collector.server_address[1]}")
        monkeypatch.setenv("LINGUAFUSION_OTEL__SERVICE_NAME", "lf-otlp-test")
        settings = Settings(state_dir=tmp_path)
        settings.server.auth = False
        with LiveApp(create_app(settings, warm=False)) as live:
            r = httpx.post(live.url + "/v1/translate", data={"target_lang": "es", "source_lang": "en",
                                                             "text": "The dog is black."}, timeout=60)
            assert r.status_code == 200 and r.json()["text"] == "El perro es negro."
        # the server's shutdown flushed the queued spans to the collector
    finally:
        collector.shutdown()
        collector.server_close()
    assert ("/v1/traces", "lf-otlp-test", "POST /v1/translate") in Collector.received
    assert ("/v1/traces", "lf-otlp-test", "mt") in Collector.received


def test_tracing_off_imports_no_sdk_and_makes_no_spans(tmp_path: Path) -> None:
    """Off (the default): a file request and a stream run, and the OpenTelemetry SDK is never imported (FastAPI
    itself imports the API package); nothing carries a span."""
    code = f"""
import asyncio, json, sys
sys.path.insert(0, {str(SRC)!r})
from starlette.testclient import TestClient
from lingua_fusion.api import create_app
from lingua_fusion.config import Settings
from lingua_fusion.errors import BackendError
from lingua_fusion.sdk.local import LocalTranslator
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import CallContext, MtInput
from lingua_fusion.serving.ports import CallContext

settings = Settings(state_dir={str(tmp_path)!r})
settings.server.auth = False
seen = []
app = create_app(settings, warm=False)
with TestClient(app, base_url="http://127.0.0.1") as client:
    r = client.post("/v1/translate", data={{"target_lang": "es", "source_lang": "en", "text": "The dog is black."}})
translator = LocalTranslator(settings)
service = translator.streams()
run = service.executor.run
async def spy(key, payload, ctx):
    seen.append(ctx.trace)
    return await run(key, payload, ctx)
service.executor.run = spy

async def stream():
    async with translator.stream(["es"], partials=False, inputs=["text"]) as s:
        await s.send_text("The dog is black.")
        await s.end()
        return [ev.text async for ev in s if ev.type == "final"]
finals = asyncio.run(stream())
print(json.dumps({{"status": r.status_code, "text": r.json().get("text", r.text), "finals": finals,
                  "tracer": app.state.tracer, "local": translator.tracer,
                  "traces": [t for t in seen if t is not None], "calls": len(seen),
                  "sdk": sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk"))}}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["status"] == 200 and out["text"] == "El perro es negro." and out["finals"] == ["El perro es negro."]
    assert out["tracer"] is None and out["local"] is None and out["calls"] >= 1 and out["traces"] == []
    assert out["sdk"] == []


# ---- across process boundaries: serve --workers' model process, a cluster's model replica ------------------------
def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    (found,) = [s for s in spans if s.name == name]
    return found


def _remote_pair(gateway: list[ReadableSpan], model: list[ReadableSpan], stream: TraceRef, name: str) -> None:
    """``gateway`` holds the caller's client span ``name`` under ``stream`` (remote, kind CLIENT); ``model`` (the
    other side's exporter) the item's batch span under that client span, on the same trace."""
    from opentelemetry.trace import SpanKind

    client, item = _one(gateway, name), _one(model, name)
    assert client.kind == SpanKind.CLIENT and attr(client, "remote") is True
    assert client.parent is not None and client.parent.span_id == stream.span.context.span_id
    assert client.context is not None and item.context is not None and item.parent is not None
    assert item.parent.is_remote and item.parent.span_id == client.context.span_id
    assert item.context.trace_id == client.context.trace_id == stream.span.context.trace_id
    assert attr(item, "batch_size") == 1 and attr(item, "model_key") == attr(client, "model_key") == "mt:en-es"
    assert client.start_time <= item.start_time <= item.end_time <= client.end_time  # type: ignore[operator]


async def test_a_model_call_to_the_model_process_carries_its_trace_over_the_socket(tmp_path: Path) -> None:
    """A worker's RemotePort and a ModelServer over a real Unix socket (each with its own tracer, as two processes
    have): the worker's client span goes over the wire as a traceparent and the model process records the batch
    span under it. Tracing off: the message carries no traceparent."""
    from lingua_fusion.models.registry import Registry
    from lingua_fusion.serving.shard.model_process import ModelServer
    from lingua_fusion.serving.shard.remote import ModelLink, RemotePort

    settings = Settings(state_dir=tmp_path)
    worker_spans, model_spans = InMemorySpanExporter(), InMemorySpanExporter()
    worker, model = Tracer.to_exporter(worker_spans, "lf-worker"), Tracer.to_exporter(model_spans, "lf-model")
    path = str(tmp_path / "m.sock")
    server = ModelServer(settings, Registry(settings), tracer=model)
    listener = await asyncio.start_unix_server(server.handle, path=path)
    link = ModelLink(path)
    port = RemotePort(link, Registry(settings), settings)
    sent: list[dict[str, Any]] = []
    call = link.call

    async def spy(msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        sent.append(msg)
        return await call(msg, timeout_s)

    link.call = spy  # type: ignore[method-assign]
    stream = worker.stream("st_a", "key_a", "standard", "en", ["es"])
    try:
        await _one_traced_one_untraced_call(port, stream)
    finally:
        stream.end()
        await link.close()
        listener.close()
        await server.close()
    assert [m["op"] for m in sent] == ["run", "run"]
    client = _one(list(worker_spans.get_finished_spans()), "mt").context
    assert client is not None and sent[0]["traceparent"] == \
        f"00-{client.trace_id:032x}-{client.span_id:016x}-{client.trace_flags:02x}"
    assert "traceparent" not in sent[1] and "trace" not in sent[1]["ctx"]  # off: nothing added
    spans = list(worker_spans.get_finished_spans())
    assert sorted(s.name for s in spans) == ["mt", "stream"]
    _remote_pair(spans, list(model_spans.get_finished_spans()), stream, "mt")  # the untraced call: no span there
    (item,) = model_spans.get_finished_spans()
    assert item.resource.attributes["service.name"] == "lf-model"


async def _one_traced_one_untraced_call(port: Any, stream: Any) -> None:
    """An MT call from a traced stream, then one from an untraced stream, through ``port``: both translate."""
    key = ModelKey.mt("en", "es")
    assert await port.run(key, MtInput("The dog is black."), CallContext("st_a", trace=stream)) == \
        "El perro es negro."
    assert await port.run(key, MtInput("The house is big."), CallContext("st_b")) == "La casa es grande."


async def test_a_model_call_to_a_cluster_replica_carries_its_trace_in_the_call() -> None:
    """The gateway's ClusterExecutor and a real ModelReplica (no Serve: the handle pickles the Call as Ray does):
    the client span's traceparent rides in the Call and the replica's own tracer records the batch span under it."""
    import pickle
    from types import SimpleNamespace

    from lingua_fusion.cluster.port import ClusterExecutor
    from lingua_fusion.cluster.replica import ModelReplica
    from lingua_fusion.cluster.wire import Call, Reply
    from lingua_fusion.models.registry import Registry

    settings = Settings()
    replica = ModelReplica(settings.model_dump(mode="json"), warm=())
    assert replica.tracer is None  # deployed without otel.endpoint: off
    gateway_spans, replica_spans = InMemorySpanExporter(), InMemorySpanExporter()
    gateway = Tracer.to_exporter(gateway_spans, "lf-gateway")
    replica.tracer = Tracer.to_exporter(replica_spans, "lf-replica")
    calls: list[Call] = []

    async def remote(call: Call) -> Reply:
        calls.append(call)
        return await replica.run(pickle.loads(pickle.dumps(call)))

    port = ClusterExecutor(Registry(settings), settings, handle=SimpleNamespace(run=SimpleNamespace(remote=remote)))
    stream = gateway.stream("st_a", "key_a", "standard", "en", ["es"])
    try:
        await _one_traced_one_untraced_call(port, stream)
    finally:
        stream.end()
        await port.close()
        await replica.close()
    assert calls[0].traceparent and calls[1].traceparent is None  # off: nothing added
    _remote_pair(list(gateway_spans.get_finished_spans()), list(replica_spans.get_finished_spans()), stream, "mt")


class SpanCollector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver keeping each span's ids, parent, kind, attributes and the exporting process's pid."""

    spans: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        def value(v: Any) -> Any:
            return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None

        req = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
        for rs in req.resource_spans:
            resource = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                self.spans.extend({"name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                   "parent": s.parent_span_id.hex(), "kind": s.kind, "start": s.start_time_unix_nano,
                                   "end": s.end_time_unix_nano, "pid": resource.get("process.pid"),
                                   "service": resource.get("service.name"),
                                   "attrs": {a.key: value(a.value) for a in s.attributes}} for s in ss.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def test_a_sharded_servers_model_process_exports_its_spans_under_the_workers(tmp_path: Path,
                                                                                  speech: bytes) -> None:
    """``serve --workers 2`` with tracing on, exporting to a real OTLP/HTTP receiver: a stream's model calls are
    client spans in the worker (under the stream) and batch spans exported by the model process (its own pid),
    each the child of its worker span on the stream's trace."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan

    SpanCollector.spans = []
    collector = ThreadingHTTPServer(("127.0.0.1", free_port()), SpanCollector)
    receiving = threading.Thread(target=collector.serve_forever, daemon=True)
    receiving.start()
    env = {"LINGUAFUSION_OTEL__ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
           "LINGUAFUSION_OTEL__SERVICE_NAME": "lf-sharded", "LINGUAFUSION_OTEL__EXPORT_INTERVAL_S": "0.2"}
    proc = None
    try:
        url, proc = await asyncio.to_thread(start_server, tmp_path, "--no-auth", "--workers", "2", env=env,
                                            port=free_port())
        pids = json.loads((tmp_path / "serve.json").read_text())
        finals = 0
        async with MultimodalTranslator(base_url=url).stream(["es"], partials=False, slo="batch") as s:
            stream_id = s.ready["stream_id"]
            await s.send_audio(pcm16(speech), ts=0.0)
            await s.end()
            finals = len([ev async for ev in s if ev.type == "final"])
        assert finals >= 2

        def model_side(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [x for x in spans if x["pid"] == pids["model"]]

        def complete() -> bool:
            spans = list(SpanCollector.spans)
            names = [x["name"] for x in model_side(spans)]
            return any(x["name"] == "stream" for x in spans) and names.count("asr") >= finals and "mt" in names

        def settle() -> None:  # the processes export every 0.2 s; the stream span when the stream has ended
            deadline = time.monotonic() + 60
            while not complete() and time.monotonic() < deadline:
                time.sleep(0.1)

        await asyncio.to_thread(settle)
    finally:
        if proc is not None:
            await asyncio.to_thread(stop_server, proc)
        collector.shutdown()
        collector.server_close()
    spans = list(SpanCollector.spans)
    root = next(x for x in spans if x["name"] == "stream")
    assert root["attrs"][L + "stream_id"] == stream_id and root["pid"] in pids["workers"]
    by_id = {x["id"]: x for x in spans}
    items = [x for x in model_side(spans) if x["name"] in ("vad", "asr", "mt")]
    assert [x["name"] for x in items].count("asr") >= finals and "mt" in {x["name"] for x in items}
    for item in items:  # each under the worker's client span of that call, on the stream's trace
        client = by_id[item["parent"]]
        assert client["pid"] == root["pid"] and client["name"] == item["name"]
        assert client["kind"] == OtlpSpan.SpanKind.SPAN_KIND_CLIENT and client["attrs"][L + "remote"] is True
        assert client["parent"] == root["id"] and item["trace"] == client["trace"] == root["trace"]
        assert client["start"] <= item["start"] <= item["end"] <= client["end"]
        assert item["attrs"][L + "model_key"] == client["attrs"][L + "model_key"] and item["service"] == "lf-sharded"
        assert item["attrs"][L + "batch_size"] >= 1
    assert proc.returncode == 0
