"""``linguafusion stream``: play a file as a live stream (optionally paced at real time) and print events."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import Settings
from ..media import decode_audio

if TYPE_CHECKING:
    from rich.console import Console

    from ..sdk import LocalTranslator, MultimodalTranslator
    from ..sdk.stream import ReadyJSON


def detect_language(audio: np.ndarray, console: Console) -> str:
    """The CLI holds the whole file, so it can tell the stream its language before the first chunk."""
    from .. import langs
    from ..models.registry import Registry
    from .output import warn

    lang, prob = Registry(Settings()).asr(None).detect_language(audio)
    code = langs.normalize(lang)
    low = " (LOW: the detection may be wrong)" if prob < 0.5 else ""
    warn([f"detected source language: {code} ({langs.name(code)}), confidence {prob:.2f}{low}; pass --from to set it"])
    return code


def read_media(path: Path) -> bytes:
    """The file to play: audio or video only, said plainly before any work (an image or a text is not a stream)."""
    from ..errors import UnsupportedMedia
    from ..media import sniff
    from ..sdk.common import read_file

    data = read_file(path)
    kind = sniff(data)
    if kind.family == "image":
        raise UnsupportedMedia(f"{path.name} is an image: `linguafusion stream` plays audio or video files; "
                               f"translate a slide with `linguafusion translate {path.name} --to LANG`",
                               details={"detected": kind.container})
    if kind.family == "text":
        raise UnsupportedMedia(f"{path.name} is text: `linguafusion stream` plays audio or video files; "
                               f"translate a text with `linguafusion translate {path.name} --to LANG`",
                               details={"detected": kind.container})
    if kind.family not in {"audio", "av"}:
        raise UnsupportedMedia(f"{path.name} is not an audio or video file this server reads "
                               "(wav, mp3, m4a, ogg, flac, webm, mp4)", details={"detected": kind.container})
    return data


def check_request(client: MultimodalTranslator | LocalTranslator, targets: list[str], slo: str,
                  source_lang: str | None) -> tuple[list[str], str | None]:
    """Refuse a bad --slo, an unknown or unserved --to and a wrong key, before language detection or any
    decoding."""
    from .. import langs
    from ..errors import InvalidParameter, UnsupportedPair
    from ..serving.ports import SLO_CLASSES

    if slo not in SLO_CLASSES:
        raise InvalidParameter(f"--slo must be one of {', '.join(sorted(SLO_CLASSES))}, not {slo!r}")
    norm = [langs.normalize(t, field="target_langs") for t in targets]
    if source_lang is not None and source_lang.strip().lower() == "auto":  # each utterance's, told by the server
        client.check_key()  # which languages it may detect, and their routes, are the start message's to check
        return norm, "auto"
    source = langs.normalize(source_lang, field="source_lang") if source_lang else None
    client.check_key()
    pairs = set(client.models()["pairs"])
    reachable = {p.split("-")[1] for p in pairs}
    for t in norm:
        if (source is not None and t != source and f"{source}-{t}" not in pairs) or (
                source is None and t not in reachable):
            what = f"{source} -> {t}" if source else f"anything into {t}"
            raise UnsupportedPair(f"no installed model translates {what}; served pairs: {', '.join(sorted(pairs))}",
                                  details={"target_lang": t})
    return norm, source


async def play_file(path: Path, *, targets: list[str], source_lang: str | None, slo: str, realtime: bool, chunk_ms: int,
                    partials: bool, as_json: bool, url: str | None, api_key: str | None, console: Console,
                    room: bool = False, allow: list[str] | None = None, diarize: bool = False,
                    words: bool = False) -> int:
    from ..errors import InvalidParameter
    from ..sdk import LocalTranslator, MultimodalTranslator
    from ..sdk.stream import LocalStream, RemoteStream

    if room and not url:
        raise InvalidParameter("--room publishes the stream on a server for listeners: give --url")
    if allow and not room:
        raise InvalidParameter("--allow names languages a room's listeners may ask for: give --room too")

    data = await asyncio.to_thread(read_media, path)
    client = MultimodalTranslator(api_key=api_key, base_url=url) if url else LocalTranslator()
    # the tags go to the server as given (zh-TW asks for Traditional characters); the codes are for printing
    tags, source_tag = list(targets), source_lang
    targets, source_lang = await asyncio.to_thread(check_request, client, targets, slo, source_lang)
    audio, _info = decode_audio(data, Settings().limits, what=path.name)
    from ..video.stream_source import has_video, video_frames

    frames = video_frames(data, Settings().limits) if has_video(data, Settings().limits) else None  # slides too
    if source_lang is None:
        source_lang = await asyncio.to_thread(detect_language, audio, console)
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    if not realtime:
        chunk_ms = max(chunk_ms, 2000)  # as fast as possible, in bigger pieces (the server limits messages per second)
    step = int(16000 * chunk_ms / 1000) * 2
    stream: RemoteStream | LocalStream
    if room and isinstance(client, MultimodalTranslator):  # --room needs --url: checked above
        stream = client.stream(tags, source_lang=source_tag or source_lang, slo=slo, partials=partials,
                               diarize=diarize, word_timestamps=words, room=True,
                               room_targets=[*targets, *(allow or [])])
    else:
        stream = client.stream(tags, source_lang=source_tag or source_lang, slo=slo, partials=partials,
                               diarize=diarize, word_timestamps=words)
    if isinstance(stream, RemoteStream):  # over the network: it may break and resume (in-process it cannot)
        stream.on_break = lambda st: console.print(
            f"connection lost; reconnecting (for up to {st.reconnect_timeout:g} s)", markup=False, style="yellow")
        stream.on_reconnect = lambda st: console.print(
            f"reconnected and resumed after caption {st.last_seq}", markup=False, style="yellow")
    async with stream as s:
        t0 = time.monotonic()
        if room:  # where listeners join: `linguafusion listen ROOM_ID --token TOKEN --to LANG --url URL`
            _show_room(s.ready, as_json, console)

        async def send() -> None:
            frame = await anext(frames, None) if frames is not None else None
            for i, off in enumerate(range(0, len(pcm), step)):
                ts = off / 2 / 16000
                if realtime:  # a live source has a chunk once its last sample was spoken, not at its first
                    delay = t0 + (off + len(pcm[off:off + step])) / 2 / 16000 - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                while frame is not None and frames is not None and frame[0] <= ts:  # video frames up to now
                    await s.send_frame(frame[1], frame[0])
                    frame = await anext(frames, None)
                    if not realtime:
                        await asyncio.sleep(0.04)  # the server takes at most 50 messages a second
                await s.send_audio(pcm[off:off + step], ts)
                if not realtime and i % 8 == 0:
                    await asyncio.sleep(0)
            while frame is not None and frames is not None:
                await s.send_frame(frame[1], frame[0])
                frame = await anext(frames, None)
                if not realtime:
                    await asyncio.sleep(0.04)
            await s.end()

        sender = asyncio.create_task(send())
        finals: list[dict[str, object]] = []
        shown = _Shown()
        try:
            async for ev in s:
                event = ev.model_dump(exclude_none=True)
                if ev.type == "final":
                    if realtime and ev.end is not None:
                        event["latency_s"] = round(time.monotonic() - t0 - ev.end, 3)
                    finals.append(event)
                print_event(ev.type, event, targets, as_json=as_json, console=console)
                _tell(ev.type, event, console, shown)
        finally:
            if not sender.done():
                sender.cancel()
            else:
                sender.result()
            if frames is not None:
                await frames.aclose()
    if finals:
        from ..lab.eval.latency import summarize

        lat = summarize(finals, len(audio) / 16000)
        console.print("latency (ms; _ca = computation-aware): " + json.dumps(lat), markup=False, style="dim")
    return 0


def _show_room(ready: ReadyJSON, as_json: bool, console: Console) -> None:
    if as_json:
        sys.stdout.write(json.dumps(ready, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    else:
        console.print(f"room {ready.get('room_id')}: listeners join with `linguafusion listen {ready.get('room_id')} "
                      f"--token {ready.get('listener_token')} --to LANG --url URL`", markup=False)


class _Shown:
    """What was already said on stderr once (one low-confidence warning per target, not one per caption)."""

    def __init__(self) -> None:
        self.low: set[str] = set()


def print_event(kind: str, data: Mapping[str, object], targets: list[str], *, as_json: bool,
                console: Console) -> None:
    """One event on stdout, as a stream or a room listener shows it: a JSON line each with --json, else finals as
    captions and partials / revisions dimmed."""
    if as_json:
        sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    elif kind == "final":
        _print_final(data, targets)
    elif kind in ("partial", "revision"):
        console.print(f"  ... {data.get('source_text', '')}", style="dim", markup=False)


def _items(value: object) -> list[object]:
    """An event's list field (``low_confidence``, ``words``); none when absent."""
    return list(value) if isinstance(value, (list, tuple)) else []


def _fields(value: object) -> Mapping[str, object]:
    """An event's object field (``translations``, ``untranslated``); empty when absent."""
    return value if isinstance(value, dict) else {}


def _print_final(data: Mapping[str, object], targets: list[str]) -> None:
    """One caption: every target's translation (a stream with two targets prints both)."""
    head = f"[{data.get('start', 0):7.2f}-{data.get('end', 0):7.2f}] #{data.get('seq')}"
    who = data.get("speaker_name") or data.get("speaker")
    head = f"{head} {who}:" if who else head
    translations = _fields(data.get("translations"))
    low = set(_items(data.get("low_confidence")))
    if len(targets) == 1:
        mark = " (low confidence)" if targets[0] in low else ""
        sys.stdout.write(f"{head} {data.get('text', '')}{mark}\n")
    else:
        sys.stdout.write(f"{head} {data.get('source_text', '')}\n")
        for t in targets:
            mark = " (low confidence)" if t in low else ""
            sys.stdout.write(f"    {t}: {translations.get(t, '')}{mark}\n")
    if data.get("words"):  # a --words stream's: the spoken words with their times
        sys.stdout.write("    " + " ".join(f"{w['word']}@{w['start']:.2f}" for w in _items(data["words"])
                                          if isinstance(w, dict)) + "\n")
    sys.stdout.flush()


def _tell(kind: str, data: Mapping[str, object], console: Console, shown: _Shown) -> None:
    """Notes on stderr, in every output mode (--json included): errors, degraded service, low-confidence routes."""
    if kind == "error":
        console.print(f"error [{data.get('code')}]: {data.get('message')}", markup=False, style="red")
    elif kind in ("not_durable", "degraded"):
        console.print(f"warning: {kind}: {data.get('message') or data}", markup=False, style="yellow")
    elif kind in ("durable", "restored"):
        console.print(f"{kind}: {data}", markup=False, style="green")
    if kind != "final":
        return
    for t in _items(data.get("low_confidence")):
        if isinstance(t, str) and t not in shown.low:
            shown.low.add(t)
            console.print(f"warning: low-confidence translation into {t}: the tiny LLM translates this pair, or "
                          "its route measured weak (often wrong; `linguafusion models` says which)", markup=False,
                          style="yellow")
    if data.get("failed"):
        console.print(f"warning: caption {data.get('seq')}: {data.get('note')}", markup=False, style="red")
    for t, words in _fields(data.get("untranslated")).items():
        console.print(f"warning: caption {data.get('seq')}: untranslated words left as written in {t}: "
                      f"{', '.join(str(w) for w in _items(words))}", markup=False, style="yellow")
