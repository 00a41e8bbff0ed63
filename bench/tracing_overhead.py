"""What OpenTelemetry tracing costs: a file translation and a live stream with tracing off and on, in the same
process, interleaved round by round (off, on, off, on, ...), so machine load hits both alike; plus the cost of one
stage hook off (a None check) and on (a span), and whether the SDK is imported at all when off.

"On" is the real export path: OTLP/HTTP protobuf through the BatchSpanProcessor to a receiver in another process
(a stand-in collector that answers 200), exactly what ``LINGUAFUSION_OTEL__ENDPOINT`` sets up.

    .venv/bin/python bench/tracing_overhead.py --json bench/results/tracing_overhead.json [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("ready", flush=True)
s.serve_forever()
"""
OFF_CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
from lingua_fusion.config import Settings
from lingua_fusion.sdk.local import LocalTranslator
from lingua_fusion.api import create_app
t = LocalTranslator(Settings())
app = create_app(Settings(), engine=t.engine, warm=False)
t.streams()
print(sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")))
"""
SENTENCES = ["Good morning everyone and welcome to the quarterly review.", "The new office will open in the spring.",
             "Please send me the report before Friday.", "We need more time to finish the project."]


def span_counter() -> Any:
    """A span processor that counts ended spans (beside the exporting one)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class Counter(SpanProcessor):
        n = 0

        def on_end(self, span: Any) -> None:
            self.n += 1

    return Counter()


def hook_costs(tracer: Any) -> dict[str, float]:
    from lingua_fusion.tracing import record_batch, span

    def off_span() -> None:
        with span(None, "asr"):
            pass

    untraced = [(None, 0.0, False)] * 8
    now = time.monotonic()
    n = 200_000
    off_span_ns = timeit.timeit(off_span, number=n) / n * 1e9
    off_batch_ns = timeit.timeit(lambda: record_batch("asr:tiny.en", "asr", untraced, now, now), number=n) / n * 1e9
    root = tracer.root("bench")
    m = 1_600  # spans: within the export queue (2048), so none is dropped while timing

    def on_span() -> None:
        with span(root, "asr"):
            pass

    traced = [(root, now, False)] * 8
    on_span_us = timeit.timeit(on_span, number=m) / m * 1e6
    on_batch_us = timeit.timeit(lambda: record_batch("asr:tiny.en", "asr", traced, now, now), number=m // 8) / (
        m // 8) * 1e6
    root.end()
    tracer.provider.force_flush()
    return {"off_span_hook_ns": round(off_span_ns, 1), "off_record_batch_of_8_ns": round(off_batch_ns, 1),
            "on_span_us": round(on_span_us, 2), "on_record_batch_of_8_us": round(on_batch_us, 2)}


def file_round(engine: Any, wav: bytes, tracer: Any | None) -> tuple[float, float]:
    """One speech file translated: (wall ms, process CPU ms: every thread of this process, the models' included)."""
    from lingua_fusion.files import FileRequest

    req = FileRequest(source_modality="audio", target_lang="es", source_lang="en", data=wav)
    t0, c0 = time.perf_counter(), time.process_time()
    if tracer is None:
        engine.translate(req)
    else:
        root = tracer.root("POST /v1/translate")
        try:
            engine.translate(req, trace=root)
        finally:
            root.end()
    return (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000


async def stream_round(local: Any, pcm: bytes) -> tuple[float, float, int]:
    """The talk sent as fast as it is read (0.25 s messages), to its closed event: (wall ms, CPU ms, finals)."""
    from lingua_fusion.errors import Overloaded

    for _ in range(60):  # admission learns the model costs online: on a busy machine it may say no for a while
        try:
            s = await local.stream(["es"], partials=True, slo="batch").__aenter__()
            break
        except Overloaded:
            await asyncio.sleep(1.0)
    else:
        raise RuntimeError("admission refused the stream for a minute")
    t0, c0 = time.perf_counter(), time.process_time()
    finals = 0
    try:
        step = 8000  # bytes: 0.25 s of 16 kHz PCM16
        for i in range(0, len(pcm), step):
            await s.send_audio(pcm[i:i + step], ts=i / 32000)
        await s.end()
        async for ev in s:
            finals += ev.type == "final"
    finally:
        await s.__aexit__(None, None, None)
    return (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000, finals


def summary(off: list[tuple[float, float]], on: list[tuple[float, float]], spans: float, span_us: float) \
        -> dict[str, Any]:
    """Medians of wall and CPU time off and on, their ratios, and the cost the spans alone account for (spans x
    the measured cost of one span): on a machine shared with other work the measured ratios are mostly noise."""
    out: dict[str, Any] = {}
    for i, what in enumerate(("wall", "cpu")):
        a, b = [x[i] for x in off], [x[i] for x in on]
        mo, mn = statistics.median(a), statistics.median(b)
        out[what] = {"off_ms": [round(x, 1) for x in a], "on_ms": [round(x, 1) for x in b],
                     "off_median_ms": round(mo, 1), "on_median_ms": round(mn, 1), "on_over_off": round(mn / mo, 4)}
    spans_ms = spans * span_us / 1000
    out["spans"] = spans
    out["spans_cost_ms"] = round(spans_ms, 3)
    out["spans_cost_share_of_cpu"] = round(spans_ms / out["cpu"]["off_median_ms"], 6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/tracing_overhead.json")
    args = ap.parse_args()

    off_import = subprocess.run([sys.executable, "-c", OFF_CHECK, str(ROOT / "src")], capture_output=True,
                                text=True, timeout=300, check=True).stdout.strip().splitlines()[-1]

    from conftest import free_port, talk_wav

    from lingua_fusion.config import OtelSettings, Settings
    from lingua_fusion.lab.fixtures import git_commit, machine
    from lingua_fusion.media import decode_audio
    from lingua_fusion.sdk.local import LocalTranslator
    from lingua_fusion.tracing import Tracer

    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        tracer = Tracer.otlp(OtelSettings(endpoint=f"http://127.0.0.1:{port}", service_name="bench"))
        counted = span_counter()
        tracer.provider.add_span_processor(counted)
        hooks = hook_costs(tracer)

        with tempfile.TemporaryDirectory() as state:
            settings = Settings(state_dir=Path(state))
            plain = LocalTranslator(settings)
            traced = LocalTranslator(settings, engine=plain.engine, tracer=tracer)  # the same models, warm in both
            wav = talk_wav(SENTENCES[:2])
            audio, _ = decode_audio(talk_wav(SENTENCES), settings.limits)
            pcm = (audio.clip(-1, 1) * 32767).astype("<i2").tobytes()
            file_round(plain.engine, wav, None)  # warm-up: models loaded before anything is timed
            file_off: list[tuple[float, float]] = []
            file_on: list[tuple[float, float]] = []
            stream_off: list[tuple[float, float]] = []
            stream_on: list[tuple[float, float]] = []
            finals: set[int] = set()

            async def streams() -> None:
                await stream_round(plain, pcm)  # warm-up
                for _ in range(args.rounds):
                    for local, out in ((plain, stream_off), (traced, stream_on)):
                        wall, cpu, n = await stream_round(local, pcm)
                        out.append((wall, cpu))
                        finals.add(n)
                await plain.close_streams()
                await traced.close_streams()

            for _ in range(args.rounds):
                file_off.append(file_round(plain.engine, wav, None))
                before = counted.n
                file_on.append(file_round(plain.engine, wav, tracer))
                file_spans = counted.n - before
            before = counted.n
            asyncio.run(streams())
            stream_spans = (counted.n - before) / args.rounds
            plain.engine.close()
        tracer.shutdown()
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)

    per_span_us = max(hooks["on_span_us"], hooks["on_record_batch_of_8_us"] / 8)  # the dearer of the two kinds
    report = {
        "what": "tracing off vs on (OTLP/HTTP to a local receiver), same process, interleaved rounds",
        "commit": git_commit(), "machine": machine(), "rounds": args.rounds,
        "sdk_modules_imported_when_off": json.loads(off_import.replace("'", '"')),
        "hooks": hooks,
        "file_speech_2_sentences_en_es": summary(file_off, file_on, file_spans, per_span_us),
        "stream_4_sentences_en_es_batch_slo_partials": {**summary(stream_off, stream_on, stream_spans, per_span_us),
                                              "finals": sorted(finals)},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("machine",)}, indent=2))


if __name__ == "__main__":
    main()
