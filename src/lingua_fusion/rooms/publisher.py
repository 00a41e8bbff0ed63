"""The publishing side of a room: a tap on the publisher's StreamSession and the sync of its targets.

The tap (called for every event the session emits, never blocking it) copies what a room carries (partials,
finals, slides, speech, closed) into a bounded queue; one pump task publishes them on the bus in order, each
stamped with ``published_at`` (wall-clock seconds, so listeners can measure delivery). A room whose bus is down
for long drops partials first and counts what it dropped; the publisher's own stream is never slowed.

Targets: the stream translates into the union of its own targets and the languages listeners ask for now (read
from the directory every ``SYNC_S``) that the room allows (``model.listenable``: a presence entry for any other
language, however it got there, costs nothing); a language added while the room is live is translated from its next
final, one nobody listens to any more stops costing anything. A room whose record is gone (deleted, its owner's key
revoked) stops being published.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Callable

from ..errors import LinguaFusionError
from ..stream.events import Event, Final, Partial, Slide
from ..stream.session import StreamSession
from .bus import RoomBus, seq_of
from .directory import RoomDirectory
from .metrics import RoomMetrics
from .model import PUBLISHED, Room, State

log = logging.getLogger("lingua_fusion.rooms")
SYNC_S = 0.5
TOUCH_S = 600.0  # a live room's record and tokens get their expiry pushed on this often (RoomDirectory.touch)
ORPHAN_S = 120.0  # a room whose stream left without ending (and did not resume) ends after this
PUBLISH_QUEUE = 1024
MAX_SLIDES_IN_FLIGHT = 2  # slides being translated for the room at once; more go out untranslated
SPEECH = "speech:"  # presence key of listeners who want a language spoken (rooms/service.py)
SPEECH_S = 30.0
SLIDE_MT_S = 30.0  # a slide goes out with the languages translated by then
PARTIAL_MT_S = 5.0  # a partial's translation into the room's other languages is dropped past this


class RoomPublisher:
    def __init__(self, room_id: str, session: StreamSession, bus: RoomBus, directory: RoomDirectory, *,
                 low_confidence: Callable[[str], bool], clock: Callable[[], float] = time.time,
                 metrics: RoomMetrics | None = None, epoch: int = 0, orphan_s: float = ORPHAN_S,
                 allowed: frozenset[str] | None = None) -> None:
        self.room_id = room_id
        self.epoch = epoch
        self.orphan_s = orphan_s
        self.session = session
        self.bus = bus
        self.directory = directory
        self.clock = clock
        self.metrics = metrics
        self.own = list(session.spec.targets)  # the publisher's own targets: always translated
        self.allowed = allowed if allowed is not None else frozenset(self.own)  # what listeners may add
        self._low_confidence = low_confidence
        self._queue: asyncio.Queue[dict[str, object]] = asyncio.Queue(maxsize=PUBLISH_QUEUE)
        self.dropped = 0
        self.finals = 0
        self._tasks: list[asyncio.Task[None]] = []
        self.ended = False
        self._busy = False
        self.finals_tapped = 0
        # the newest partial waiting for its other languages: its room event, that event's translations, and the
        # finals tapped when it came
        self._partial: tuple[dict[str, object], dict[str, str], int] | None = None
        self._partial_ready = asyncio.Event()
        self._slides: set[asyncio.Task[None]] = set()
        self.speech_langs: set[str] = set()  # languages some listener wants spoken
        self._to_speak: asyncio.Queue[tuple[int, dict[str, str]]] = asyncio.Queue(maxsize=16)  # seq, translations

    def start(self) -> None:
        self.session.tap = self.tap
        self._tasks = [asyncio.create_task(self._pump(), name=f"room-pump:{self.room_id}"),
                       asyncio.create_task(self._sync(), name=f"room-sync:{self.room_id}"),
                       asyncio.create_task(self._partials(), name=f"room-partials:{self.room_id}"),
                       asyncio.create_task(self._speak(), name=f"room-speech:{self.room_id}")]

    async def _partials(self) -> None:
        """A partial's tentative translation into the room's other languages (the stream makes only its first
        target's): tentative work, shed first under load; one at a time, the newest partial only, dropped when a
        final came meanwhile (it would arrive after the caption it announced)."""
        while True:
            await self._partial_ready.wait()
            self._partial_ready.clear()
            if self._partial is None:
                continue
            wire, translations, finals_then = self._partial
            self._partial = None
            outs = await self._translate(str(wire["source_text"]), self.session.spec.targets[1:])
            translations.update(outs)
            if self.finals_tapped == finals_then and not self.ended:
                self._put(wire)

    def tap(self, event: Event) -> None:
        if event.TYPE not in PUBLISHED or self.ended:
            return
        wire: dict[str, object] = {**event.to_wire(), "published_at": round(self.clock(), 6)}
        if isinstance(event, Partial):  # and its Revision
            targets = self.session.spec.targets
            translations = wire["translations"] = {targets[0]: event.text}
            if len(targets) > 1 and event.source_text:
                self._partial = (wire, translations, self.finals_tapped)  # the newest waits; older ones are superseded
                self._partial_ready.set()
                return
        if isinstance(event, Slide) and event.source_text and len(self._slides) < MAX_SLIDES_IN_FLIGHT:
            task = asyncio.create_task(self._slide(wire, event.source_text), name=f"room-slide:{self.room_id}")
            self._slides.add(task)
            task.add_done_callback(self._slides.discard)
            return
        if isinstance(event, Final):
            self.finals_tapped += 1
            if self.speech_langs:
                with contextlib.suppress(asyncio.QueueFull):  # far behind: this caption is not spoken
                    self._to_speak.put_nowait((event.seq, event.translations))
        self._put(wire)

    async def _speak(self) -> None:
        """Speech for listeners who asked for it (``speech=true``), in their languages: each final's translation
        synthesized once per language however many listen (the publisher's own speech, in its first target when
        it asked for speech, is already among the room's events)."""
        from ..serving.keys import ModelKey
        from ..serving.ports import CallContext

        while True:
            seq, translations = await self._to_speak.get()
            spec = self.session.spec
            ctx = CallContext(spec.stream_id, spec.slo, spec.importance, False, key_id=spec.key_id)
            for lang in sorted(self.speech_langs):
                text = translations.get(lang)
                if not text or (spec.speech and lang == spec.targets[0]):
                    continue
                try:
                    wav = await asyncio.wait_for(self.session.jobs.port.run(ModelKey.tts(lang), text, ctx), SPEECH_S)
                except (LinguaFusionError, TimeoutError) as exc:
                    log.info("room %s: speech for caption %s in %s failed: %s", self.room_id, seq, lang,
                             exc)
                    continue
                if wav and not self.ended:
                    self._put({"type": "speech", "seq": seq, "lang": lang, "format": "wav",
                               "audio_base64": base64.b64encode(wav).decode("ascii"),
                               "published_at": round(self.clock(), 6)})

    async def _slide(self, wire: dict[str, object], source_text: str) -> None:
        """A slide's text in every language of the room (the translation memory makes a deck shown in several
        rooms, or again, cost its MT once), then published; untranslated languages are simply absent."""
        spec = self.session.spec
        # committed work, not tentative: a slide read is content listeners keep, not a preview
        wire["translations"] = await self._translate(source_text, list(spec.targets), tentative=False,
                                                     within_s=SLIDE_MT_S)
        if not self.ended:
            self._put(wire)

    def _put(self, wire: dict[str, object]) -> None:
        try:
            self._queue.put_nowait(wire)
        except asyncio.QueueFull:
            self.dropped += 1  # the bus is far behind: this room's listeners reconnect from the history
            if self.metrics is not None:
                self.metrics.room_events_dropped.inc()

    async def _translate(self, text: str, targets: list[str], *, tentative: bool = True,
                         within_s: float = PARTIAL_MT_S) -> dict[str, str]:
        """``text`` in ``targets`` (tentative work is shed first under load); what did not come within
        ``within_s`` is left out. The source language itself is the text."""
        from ..serving.keys import ModelKey
        from ..serving.ports import CallContext, MtInput

        spec = self.session.spec
        ctx = CallContext(spec.stream_id, spec.slo, spec.importance, tentative, key_id=spec.key_id)
        langs = [t for t in targets if t != spec.source_lang]
        same = {t: text for t in targets if t == spec.source_lang}
        port, glossary = self.session.jobs.port, self.session.jobs.glossary
        try:
            outs = await asyncio.wait_for(asyncio.gather(*(
                port.run(ModelKey.mt(spec.source_lang, lang), MtInput(text, glossary), ctx) for lang in langs)),
                within_s)
        except (LinguaFusionError, TimeoutError):
            return same
        return {**same, **{lang: str(o) for lang, o in zip(langs, outs, strict=True) if o is not None}}

    async def _pump(self) -> None:
        while True:
            event = await self._queue.get()
            self._busy = True
            while True:
                try:
                    await self.bus.publish(self.room_id, event)
                    break
                except LinguaFusionError as exc:  # Redis down: keep the order, retry (the tap drops when full)
                    log.warning("room %s: publish failed (%s); retrying", self.room_id, exc.message)
                    await asyncio.sleep(0.5)
            if self.metrics is not None:
                self.metrics.room_events.labels(type=event["type"]).inc()
            if event["type"] == "final":
                self.finals = seq_of(event)
            if event["type"] == "closed":
                await self._finish()
                return
            self._busy = False

    async def _finish(self) -> None:
        self.ended = True
        for task in self._tasks[2:]:  # no partial or speech after `closed`
            task.cancel()
        with contextlib.suppress(LinguaFusionError):
            room = await self.directory.get(self.room_id)
            if room is not None:
                room.state, room.finals = State.ENDED, self.finals
                await ended(room, self.directory, self.bus)

    async def _sync(self) -> None:
        touched = self.clock()  # created or attached (a save) just now
        while not self.ended:
            try:
                wanted = await self.directory.languages(self.room_id, self.clock())
                room = await self.directory.get(self.room_id)
                if room is not None and room.state != State.ENDED and self.clock() - touched >= TOUCH_S:
                    await self.directory.touch(room)  # live for longer than the TTL: not forgotten meanwhile
                    touched = self.clock()
            except LinguaFusionError as exc:
                log.warning("room %s: language sync failed: %s", self.room_id, exc.message)
                wanted, room = None, None
            if wanted is not None and (room is None or room.state == State.ENDED):
                self.ended = True  # deleted or ended by its owner (perhaps on another gateway): stop publishing
                self._stop_others()
                return
            if wanted is not None:
                self.speech_langs = {k.removeprefix(SPEECH) for k in wanted
                                     if k.startswith(SPEECH) and k.removeprefix(SPEECH) in self.allowed}
                self.retarget({k.removeprefix(SPEECH) for k in wanted})
            if self.session.closed.is_set() and self._queue.empty() and not self._busy:
                # the stream ended without `closed` (a lost connection; it may resume, here or elsewhere, and
                # attach again): stop publishing; the room ends if no stream attached within orphan_s
                self.ended = True
                self._stop_others()
                await self._end_if_orphaned()
                return
            await asyncio.sleep(SYNC_S)

    async def _end_if_orphaned(self) -> None:
        await asyncio.sleep(self.orphan_s)
        try:
            room = await self.directory.get(self.room_id)
            if room is None or room.state == State.ENDED or room.epoch != self.epoch:
                return  # ended, or the stream resumed (perhaps on another gateway) and attached again
            room.state, room.finals = State.ENDED, max(room.finals, self.finals)
            await ended(room, self.directory, self.bus)
            await self.bus.publish(self.room_id, {"type": "closed", "finals": room.finals,
                                                  "reason": "the publisher left", "published_at": self.clock()})
        except LinguaFusionError as exc:
            log.warning("room %s: could not end the orphaned room: %s", self.room_id, exc.message)

    def retarget(self, listened: set[str]) -> None:
        """The stream's targets := its own, then the listened languages (in a stable order). A new list, never
        changed in place: a translation in flight keeps the list it started with."""
        spec = self.session.spec
        source = spec.source_lang
        extra = sorted(lang for lang in listened if lang in self.allowed and lang not in self.own and lang != source)
        targets = self.own + extra
        if targets != spec.targets:
            spec.targets = targets
            spec.low_confidence = [t for t in targets if t in self.own and t in spec.low_confidence
                                   or t not in self.own and self._low_confidence(t)]
            log.info("room %s: translating into %s", self.room_id, targets)

    @property
    def done(self) -> asyncio.Task[None]:
        """Done once the room's `closed` is published, the room was ended, or the stream left and the room was
        ended as orphaned (or taken over by a resumed stream)."""
        return self._tasks[1]

    def _stop_others(self) -> None:
        for task in [self._tasks[0], *self._tasks[2:]]:
            if task is not asyncio.current_task():
                task.cancel()

    async def close(self) -> None:
        self.ended = True
        for task in [*self._tasks, *self._slides]:
            task.cancel()
        for task in [*self._tasks, *self._slides]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def ended(room: Room, directory: RoomDirectory, bus: RoomBus) -> None:
    """Save ``room`` as ended; the owner's oldest ended rooms past ``max_ended_per_key`` lose their history too."""
    for room_id in await directory.save(room):
        await bus.forget(room_id)
