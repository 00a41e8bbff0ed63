"""Drive a live server with N concurrent streams, paced at real time, and report against the SLOs.

Every stream measures caption latency itself: (wall time the final arrived - stream start) - final.end, i.e. how
long after its audio was spoken (sent) the caption came back. A stream meets its SLO when it was admitted and its
captions' p99 is within the class target (interactive 1 s, standard 3 s, batch 30 s); goodput counts those.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from ...serving.ports import SLO_CLASSES
from ..eval.latency import summarize
from ..fixtures import slide_png
from .mix import Material, Mix, StreamKind, material

WINDOW_S = 10.0


@dataclass
class StreamResult:
    kind: StreamKind
    admitted: bool = False
    rejected_code: str | None = None
    rejected_message: str | None = None  # the server's reason (admission, the SLO breaker, the key's quota, ...)
    error: str | None = None
    finals: list[dict[str, Any]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    start_wall: float = 0.0
    sent_s: float = 0.0
    reconnects: int = 0
    duplicates: int = 0
    stream_id: str | None = None
    not_durable: int = 0  # finals sent while the stream log was down (written later, or lost with the server)
    failed: int = 0  # finals whose ASR or MT backend kept failing (numbered, texts empty)
    partials: int = 0  # partial and revision events (tentative captions: fewer under load, stream/policy.py)


_FRAMES: dict[int, bytes] = {}


def _frame(i: int, sentences: list[str]) -> bytes:
    """Sentence ``i``'s slide as a JPEG video frame (made once per slide)."""
    if i not in _FRAMES:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.open(io.BytesIO(slide_png(sentences[i]))).convert("RGB").save(buf, format="JPEG", quality=80)
        _FRAMES[i] = buf.getvalue()
    return _FRAMES[i]


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


async def one_stream(url: str, api_key: str | None, kind: StreamKind, mat: Material, duration: float, offset: int,
                     baseline: bool, image_fault: Any = None) -> StreamResult:
    """One stream through the SDK's RemoteStream, so a server restart mid-run is survived the way users survive it
    (reconnect, resume, re-send); finals are counted as delivered."""
    from ...errors import LinguaFusionError
    from ...sdk.client import ws_url
    from ...sdk.stream import RemoteStream, start_message

    res = StreamResult(kind)
    start = start_message(kind.targets, kind.source_lang, kind.slo, kind.partials, kind.importance, None, False, 0.4)
    if baseline:
        start["engine"] = "per-stream"
    stream = RemoteStream(ws_url(url.rstrip("/")), api_key, start, reconnect_timeout=duration + 120)
    try:
        await stream.__aenter__()
    except LinguaFusionError as exc:
        res.rejected_code, res.rejected_message = exc.code, str(exc)
        return res
    res.admitted = True
    res.stream_id = stream.ready.get("stream_id")
    res.start_wall = time.monotonic()
    try:
        async def send() -> None:
            chunk = 16000 * 2 // 4  # 250 ms
            steps = int(duration * 4)
            t0 = res.start_wall
            next_text = 0
            for k in range(steps):
                delay = t0 + k * 0.25 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                ts = k * 0.25
                if kind.source == "text":
                    if k % 12 == 0:  # one sentence every 3 s
                        await stream.send_text(mat.sentences[(offset + next_text) % len(mat.sentences)], ts)
                        next_text += 1
                    continue
                a = (offset * chunk + k * chunk) % max(chunk, len(mat.pcm) - chunk)
                a -= a % 2
                await stream.send_audio(mat.pcm[a:a + chunk], ts)
                if kind.video_fps > 0:  # a screen share: frames of the current slide at video_fps
                    first, last = int(np.ceil(ts * kind.video_fps)), int(np.ceil((ts + 0.25) * kind.video_fps))
                    per_slide = max(1, int(10 * kind.video_fps))  # a new slide every 10 s
                    for j in range(first, last):
                        slide = (offset + j // per_slide) % len(mat.sentences)
                        await stream.send_frame(_frame(slide, mat.sentences), j / kind.video_fps)
                if kind.slides and k % 40 == 0:
                    png: bytes | None = slide_png(mat.sentences[(offset + k // 40) % len(mat.sentences)])
                    if image_fault is not None:
                        png = image_fault(png, offset * 1000 + k // 40)  # None: the frame was dropped
                    if png is not None:
                        await stream.send_image(png, ts)
            res.sent_s = steps * 0.25
            await stream.end()

        sender = asyncio.create_task(send())
        try:
            async def read() -> None:
                async for ev in stream:
                    if ev.type == "final":
                        data = ev.model_dump(exclude_none=True)
                        lat = time.monotonic() - res.start_wall - float(data["end"])
                        data["latency_s"] = round(lat, 3)
                        res.finals.append(data)
                        res.latencies.append(lat)
                        res.not_durable += data.get("durable") is False
                        res.failed += bool(data.get("failed"))
                    elif ev.type in ("partial", "revision"):
                        res.partials += 1
                    elif ev.type == "error" and not res.error:
                        res.error = (ev.model_extra or {}).get("code", "error")

            await asyncio.wait_for(read(), timeout=duration + 300)
        finally:
            if not sender.done():
                sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    except (LinguaFusionError, TimeoutError) as exc:
        res.error = res.error or getattr(exc, "code", type(exc).__name__)
    finally:
        res.reconnects = stream.reconnects
        res.duplicates = stream.duplicates_dropped
        await stream.__aexit__(None, None, None)
    return res


def scrape(url: str, key: str | None = None) -> dict[str, float]:
    """A few counters from the server's /metrics (summed over labels). With auth on, /metrics takes an admin key or
    the server's ``server.metrics_token`` as ``key``; refused (or unreachable), every counter reads 0."""
    want = ("process_resident_memory_bytes", "process_cpu_seconds_total", "linguafusion_shed_total",
            "linguafusion_streams_rejected_total", "linguafusion_streams_admitted_total",
            "linguafusion_caption_latency_seconds_count", "linguafusion_batch_size_sum",
            "linguafusion_batch_size_count", "linguafusion_queue_depth_max", "linguafusion_demand_scale")
    out = dict.fromkeys(want, 0.0)
    try:
        r = httpx.get(url.rstrip("/") + "/metrics", timeout=10,
                      headers={"Authorization": f"Bearer {key}"} if key else None)
    except httpx.HTTPError:
        return out
    if r.status_code != 200:
        return out
    text = r.text
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("linguafusion_queue_depth_max", "linguafusion_demand_scale"):  # maxima over models, not sums
            out[name] = max(out[name], float(line.rsplit(" ", 1)[1]))
        elif name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


async def run_load(url: str, api_key: str | None, mix: Mix, n: int, duration: float, *, seed: int = 0,
                   baseline: bool = False, audio_fault: Any = None, on_start: Any = None,
                   image_fault: Any = None) -> dict[str, Any]:
    """``audio_fault``: a function float32 audio -> degraded audio (modality faults of chaos experiments);
    ``image_fault``: a function (png bytes, frame number) -> degraded png, or None to drop the frame;
    ``on_start``: called once the media are ready, as the first stream starts (a chaos schedule's time zero)."""
    kinds = mix.assign(n, seed)
    mats: dict[str, Material] = {}
    for k in kinds:
        if k.source not in mats:
            mats[k.source] = await asyncio.to_thread(material, k.source)
            if audio_fault is not None:
                m = mats[k.source]
                audio = np.frombuffer(m.pcm, dtype="<i2").astype(np.float32) / 32768
                bad = np.clip(audio_fault(audio), -1, 1)
                mats[k.source] = Material((bad * 32767).astype("<i2").tobytes(), m.reference, m.sentences)
    r = np.random.default_rng(seed)
    if mix.arrival == "burst":
        starts = [0.0] * n
    elif mix.arrival == "ramp":
        starts = [mix.ramp_s * i / max(1, n) for i in range(n)]
    else:  # Poisson arrivals at rate n / ramp_s
        starts = list(np.cumsum(r.exponential(mix.ramp_s / max(1, n), n)))
    before = scrape(url, api_key)
    t0 = time.monotonic()
    if on_start is not None:
        on_start()

    async def launch(i: int) -> StreamResult:
        await asyncio.sleep(starts[i])
        return await one_stream(url, api_key, kinds[i], mats[kinds[i].source], duration, offset=i * 37,
                                baseline=baseline, image_fault=image_fault)

    results = await asyncio.gather(*(launch(i) for i in range(n)))
    wall = time.monotonic() - t0
    after = scrape(url, api_key)
    return summarize_run(results, n, duration, wall, before, after, mats)


def summarize_run(results: list[StreamResult], n: int, duration: float, wall: float, before: dict[str, float],
                  after: dict[str, float], mats: dict[str, Material]) -> dict[str, Any]:
    per_class: dict[str, Any] = {}
    for slo in sorted({r.kind.slo for r in results}):
        rs = [r for r in results if r.kind.slo == slo]
        lat = [x for r in rs for x in r.latencies]
        target = SLO_CLASSES[slo]
        good = [r for r in rs if r.admitted and r.latencies and pct(r.latencies, 99) <= target  # type: ignore[operator]
                and not r.error]
        simul = [summarize(r.finals, r.sent_s) for r in rs if r.finals and r.sent_s]
        windows = _windows(rs, duration)
        partials, sent = sum(r.partials for r in rs), sum(r.sent_s for r in rs if r.admitted)
        per_class[slo] = {
            "target_p99_s": target, "streams": len(rs), "admitted": sum(r.admitted for r in rs),
            "rejected": sum(r.rejected_code is not None for r in rs),
            "rejected_codes": sorted({r.rejected_code for r in rs if r.rejected_code}),
            "rejected_reasons": dict(Counter(r.rejected_message for r in rs if r.rejected_message).most_common()),
            "errors": sum(r.error is not None for r in rs), "goodput_streams": len(good),
            "error_reasons": dict(Counter(r.error for r in rs if r.error).most_common(8)),
            "finals": len(lat), "partials": partials,
            "partials_per_stream_s": round(partials / sent, 3) if sent else None,
            "caption_latency_s": {"p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99),
                                                      "p999": pct(lat, 99.9)},
            "AL_ms": _mean([s["AL_ca"] for s in simul]), "LAAL_ms": _mean([s["LAAL_ca"] for s in simul]),
            "EndOffset_ms": _mean([s["EndOffset_ca"] for s in simul]),
            "windows_p99_s": windows, "stable": _stable(windows),
            "meets_slo": bool(lat) and len(good) == len(rs),
        }
    cpu = after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]
    batches = after["linguafusion_batch_size_count"] - before["linguafusion_batch_size_count"]
    return {
        "streams": n, "duration_s": duration, "wall_s": round(wall, 1),
        "goodput_streams": sum(c["goodput_streams"] for c in per_class.values()),
        "meets_slo": all(c["meets_slo"] for c in per_class.values()),
        "classes": per_class,
        "server": {"rss_mib": round(after["process_resident_memory_bytes"] / 2**20, 1),
                   "cpu_cores_used": round(cpu / wall, 2) if wall else None,
                   "shed": after["linguafusion_shed_total"] - before["linguafusion_shed_total"],
                   "rejected": after["linguafusion_streams_rejected_total"]
                   - before["linguafusion_streams_rejected_total"],
                   "captions": after["linguafusion_caption_latency_seconds_count"]
                   - before["linguafusion_caption_latency_seconds_count"],
                   "mean_batch": round((after["linguafusion_batch_size_sum"] - before["linguafusion_batch_size_sum"])
                                       / batches, 2) if batches else None,
                   "max_queue_depth": after.get("linguafusion_queue_depth_max"),
                   # the largest of admission's measured demand over declared (serving/rates.py; 0: not measured)
                   "demand_scale": after.get("linguafusion_demand_scale")},
        "client_captions": sum(len(r.finals) for r in results),
        "integrity": integrity(results),
        "streams_seen": [{"stream_id": r.stream_id, "seqs": sorted({int(f["seq"]) for f in r.finals if "seq" in f}),
                          "reconnects": r.reconnects, "error": r.error} for r in results if r.admitted],
        "latencies": {slo: [round(x, 3) for r in results if r.kind.slo == slo for x in r.latencies]
                      for slo in per_class},
    }


def integrity(results: list[StreamResult]) -> dict[str, int]:
    """Committed captions lost (gaps in seq), duplicated (sent again after a resume), reconnections."""
    lost = 0
    for r in results:
        seqs = sorted(int(f["seq"]) for f in r.finals if "seq" in f)
        if seqs:
            lost += seqs[-1] - len(set(seqs))
    return {"lost": lost, "duplicated": sum(r.duplicates for r in results),
            "reconnects": sum(r.reconnects for r in results), "not_durable": sum(r.not_durable for r in results),
            "failed": sum(r.failed for r in results)}


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return round(float(np.mean(xs)), 1) if xs else None


def _windows(rs: list[StreamResult], duration: float) -> list[float | None]:
    """Caption p99 per full 10 s window of stream time (when the audio was spoken); a last, partial window is left
    out (it holds the end-of-stream flush, not steady state)."""
    full = max(1, int(duration // WINDOW_S))
    buckets: dict[int, list[float]] = {}
    for r in rs:
        for f, lat in zip(r.finals, r.latencies, strict=True):
            w = int(float(f["end"]) // WINDOW_S)
            if w < full:
                buckets.setdefault(w, []).append(lat)
    return [pct(buckets[k], 99) for k in sorted(buckets)]


def _stable(windows: list[float | None], tolerance: float = 0.10) -> bool:
    """The last two windows agree within 10 % (a run too short for two windows is not called stable)."""
    vals = [w for w in windows if w is not None]
    if len(vals) < 2:
        return False
    a, b = vals[-2], vals[-1]
    return abs(a - b) <= tolerance * max(a, b, 1e-9)
