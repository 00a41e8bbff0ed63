"""``linguafusion stream``: play a file as a live stream (optionally paced at real time) and print events."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .config import Settings
from .media import decode_audio


def detect_language(audio: np.ndarray, console: Any) -> str:
    """The CLI holds the whole file, so it can tell the stream its language before the first chunk."""
    from . import langs
    from .models.registry import Registry

    lang, prob = Registry(Settings()).asr(None).detect_language(audio)
    console.print(f"detected source language: {lang} (p={prob:.2f}); pass --from to set it", markup=False,
                  style="dim")
    return langs.normalize(lang)


async def play_file(path: Path, *, targets: list[str], source_lang: str | None, slo: str, realtime: bool, chunk_ms: int,
                    partials: bool, as_json: bool, url: str | None, api_key: str | None, console: Any) -> int:
    from .sdk import LocalTranslator, MultimodalTranslator

    data = await asyncio.to_thread(path.read_bytes)
    audio, _info = decode_audio(data, Settings().limits, what=path.name)
    if source_lang is None:
        source_lang = await asyncio.to_thread(detect_language, audio, console)
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    client: Any = MultimodalTranslator(api_key=api_key, base_url=url) if url else LocalTranslator()
    if not realtime:
        chunk_ms = max(chunk_ms, 2000)  # as fast as possible, in bigger pieces (the server limits messages per second)
    step = int(16000 * chunk_ms / 1000) * 2
    stream = client.stream(targets, source_lang=source_lang, slo=slo, partials=partials)
    if hasattr(stream, "on_reconnect"):
        stream.on_reconnect = lambda st: console.print(
            f"connection lost; reconnected and resumed after caption {st.last_seq}", markup=False, style="yellow")
    async with stream as s:
        t0 = time.monotonic()

        async def send() -> None:
            for i, off in enumerate(range(0, len(pcm), step)):
                ts = off / 2 / 16000
                if realtime:
                    delay = t0 + ts - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                await s.send_audio(pcm[off:off + step], ts)
                if not realtime and i % 8 == 0:
                    await asyncio.sleep(0)
            await s.end()

        sender = asyncio.create_task(send())
        finals: list[dict[str, Any]] = []
        try:
            async for ev in s:
                data = ev.model_dump(exclude_none=True)
                if ev.type == "final":
                    if realtime and ev.end is not None:
                        data["latency_s"] = round(time.monotonic() - t0 - ev.end, 3)
                    finals.append(data)
                if as_json:
                    sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
                    sys.stdout.flush()
                elif ev.type == "final":
                    sys.stdout.write(f"[{ev.start:7.2f}-{ev.end:7.2f}] #{ev.seq} {ev.text}\n")
                    sys.stdout.flush()
                elif ev.type in ("partial", "revision"):
                    console.print(f"  ... {data.get('source_text', '')}", style="dim", markup=False)
                elif ev.type == "error":
                    console.print(f"error [{data.get('code')}]: {data.get('message')}", markup=False, style="red")
                elif ev.type in ("not_durable", "degraded"):
                    console.print(f"{ev.type}: {data.get('message') or data}", markup=False, style="yellow")
                elif ev.type in ("durable", "restored"):
                    console.print(f"{ev.type}: {data}", markup=False, style="green")
                if ev.type == "final" and data.get("failed"):
                    console.print(f"caption {ev.seq}: {data.get('note')}", markup=False, style="red")
        finally:
            if not sender.done():
                sender.cancel()
            else:
                sender.result()
    if finals:
        from .lab.eval.latency import summarize

        lat = summarize(finals, len(audio) / 16000)
        console.print("latency (ms; _ca = computation-aware): " + json.dumps(lat), markup=False, style="dim")
    return 0
