"""Simultaneous commit policy for one stream's speech, and the pace of its partials (pure: no models; the pacer is
given the time).

An utterance is the audio since the last commit. While it grows, it is re-decoded every ``step_s`` (tentative
work the scheduler may shed); the words two successive hypotheses agree on (LocalAgreement-2) are shown as the
stable part of a ``partial``. The utterance is committed when the VAD hears ``eou_silence_s`` of silence after
speech, or when it reaches ``max_utterance_s`` (cut at the quietest point of its last second). The committed decode
is never shed and committed text is never retracted: later audio only ever adds new finals. A commit says why it
was cut (``cut``): at a ``pause``, at the ``length`` limit (the speaker had not stopped: its sentence may go on in
the next utterance, stream/finals.py), or at the ``end`` of the stream.

``PartialPacer`` spaces a stream's partials by load: partials are the first work dropped when the engine is busy,
committed captions never. The hop between two partials is the class's ``step_s`` while a partial's round trip (its
re-decode and tentative translation, queue included; a mean of the last few) is short, and ``ratio`` times that
round trip when it is not (a partial shed or refused doubles it), up to the class's ``max_utterance_s`` (about one
partial an utterance: each is also the probe that finds the load gone). Every stream backs off as the engine's
queues grow, so the tentative work on the engine falls with its load (a partial waits behind committed work, so its
round trip grows first), and comes back as they shrink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..types import SR

WINDOW = 512  # VAD window, 32 ms


def _key(w: str) -> str:
    return "".join(c for c in w.lower() if c.isalnum())


def agreed_prefix(a: list[str], b: list[str]) -> list[str]:
    out = []
    for x, y in zip(a, b, strict=False):
        if _key(x) != _key(y):
            break
        out.append(y)
    return out


@dataclass
class Decision:
    kind: str  # "partial" | "commit" | "wait"
    start: float = 0.0
    end: float = 0.0
    cut: str = ""  # a commit's: "pause" | "length" (max_utterance_s reached while speech went on) | "end"


@dataclass
class PolicyConfig:
    step_s: float = 1.0
    eou_silence_s: float = 0.6
    max_utterance_s: float = 10.0
    # a caption cut at max_utterance_s waits at most this long for the next utterance to finish its sentence
    # before it is translated alone (stream/finals.py)
    sentence_hold_s: float = 8.0
    speech_threshold: float = 0.5
    min_speech_s: float = 0.25


@dataclass
class CommitPolicy:
    cfg: PolicyConfig = field(default_factory=PolicyConfig)
    utt_start: float = 0.0  # stream time where the current utterance begins
    speech_start: float | None = None
    last_speech_end: float = 0.0
    speech_s: float = 0.0
    last_partial_at: float = 0.0
    probs: list[float] = field(default_factory=list)  # VAD probabilities of the current utterance's windows
    prev_hyp: list[str] = field(default_factory=list)
    _t_last: float = 0.0  # end time of the last VAD window seen

    def on_vad(self, probs: np.ndarray, t_end: float) -> list[Decision]:
        """Feed VAD probabilities of new windows ending at stream time ``t_end``; say what to do, in order.

        Windows are judged one by one, so a large chunk holding several utterances yields several commits.
        """
        out: list[Decision] = []
        n = len(probs)
        t0 = t_end - n * WINDOW / SR
        for i, p in enumerate(probs):
            self.probs.append(float(p))
            t = t0 + (i + 1) * WINDOW / SR
            self._t_last = t
            if p >= self.cfg.speech_threshold:
                if self.speech_start is None:
                    self.speech_start = t - WINDOW / SR
                self.last_speech_end = t
                self.speech_s += WINDOW / SR
            d = self._check(t)
            if d is not None:
                out.append(d)
                self.committed(d.end)
            elif self.speech_start is None:
                # silence: the utterance start follows time window by window, as when windows come one a call, so
                # a call holding a long silence then speech (a timestamp gap, one large message) neither decodes
                # the silence nor counts it toward max_utterance_s (a forced cut of silence, "you" from Whisper)
                self.utt_start = max(self.utt_start, t - 0.3)
        if self.speech_start is None:
            # silence only: let the utterance start follow time so silence is never decoded
            self.utt_start = max(self.utt_start, t_end - 0.3)
            self.probs = self.probs[-10:]
        elif t_end - self.last_partial_at >= self.cfg.step_s and self.speech_s >= self.cfg.min_speech_s:
            self.last_partial_at = t_end
            out.append(Decision("partial", self.utt_start, t_end))
        return out

    def _check(self, t: float) -> Decision | None:
        if self.speech_start is None:
            return None
        if self.speech_s < self.cfg.min_speech_s and t - self.last_speech_end >= self.cfg.eou_silence_s:
            # a click or breath too short to be a word: forget it instead of holding the utterance open
            self.speech_start = None
            self.speech_s = 0.0
            self.utt_start = max(self.utt_start, t - 0.3)
            return None
        if self.speech_s >= self.cfg.min_speech_s and t - self.last_speech_end >= self.cfg.eou_silence_s:
            return Decision("commit", self.utt_start, min(t, self.last_speech_end + 0.2), "pause")
        if t - self.utt_start >= self.cfg.max_utterance_s:
            return Decision("commit", self.utt_start, self._quietest_cut(t), "length")
        return None

    def _quietest_cut(self, t_end: float) -> float:
        last = self.probs[-int(SR / WINDOW):]  # last second
        if not last:
            return t_end
        i = int(np.argmin(last))
        return t_end - (len(last) - i - 1) * WINDOW / SR

    def stable(self, hyp: list[str]) -> list[str]:
        """LocalAgreement-2: words this hypothesis shares with the previous one."""
        agreed = agreed_prefix(self.prev_hyp, hyp)
        self.prev_hyp = hyp
        return agreed

    def committed(self, end: float) -> None:
        """The utterance up to ``end`` is committed: the next one starts there."""
        after = int(round(max(0.0, self._t_last - end) * SR / WINDOW))
        keep = self.probs[len(self.probs) - after:] if after and self.probs else []
        self.utt_start = end
        self.speech_start = None
        self.speech_s = 0.0
        self.last_speech_end = end
        self.last_partial_at = end
        self.probs = []
        self.prev_hyp = []
        # windows already seen after the cut belong to the next utterance
        for j, p in enumerate(keep):
            if p >= self.cfg.speech_threshold:
                t = end + (j + 1) * WINDOW / SR
                if self.speech_start is None:
                    self.speech_start = t - WINDOW / SR
                self.last_speech_end = t
                self.speech_s += WINDOW / SR
        self.probs = list(keep)


    def flush(self, t_end: float) -> Decision:
        """End of stream: commit whatever speech is pending."""
        if self.speech_start is not None and self.speech_s > 0:
            return Decision("commit", self.utt_start, t_end, "end")
        return Decision("wait")


@dataclass
class PartialPacer:
    """When a stream's next partial may start. ``due(now)`` before a partial, ``started(now)`` when it is sent,
    ``done(seconds)`` with its round trip when it came back (shown or not), ``shed(seconds)`` when the engine shed
    or refused it."""

    step_s: float
    max_hop_s: float
    ratio: float = 2.5
    rtt_s: float = 0.0  # the round trip: a mean that halves its past at each partial (doubled at each one shed)
    last_start: float = -math.inf
    # the ratio grows with the round trip, from ``ratio`` to ``full_ratio`` once it is ``full_rtt_s`` (0: never):
    # a slow round trip is the engine's queue, and partials are the first work to give up to committed captions
    full_ratio: float = 0.0
    full_rtt_s: float = 0.0

    @property
    def hop_s(self) -> float:
        ratio = self.ratio
        if self.full_ratio > ratio > 0 and self.full_rtt_s > 0:
            ratio += (self.full_ratio - ratio) * min(1.0, self.rtt_s / self.full_rtt_s)
        return min(self.max_hop_s, max(self.step_s, ratio * self.rtt_s))

    def due(self, now: float) -> bool:
        # the policy offers partials every step_s of stream time: half a step of slack, so a hop of k steps is
        # kept as k steps, not k + 1, when stream time runs a little ahead of the wall clock
        return now - self.last_start >= self.hop_s - 0.5 * self.step_s

    def started(self, now: float) -> None:
        self.last_start = now

    def done(self, seconds: float) -> None:
        self.rtt_s = seconds if self.rtt_s == 0.0 else 0.5 * (self.rtt_s + seconds)

    def shed(self, seconds: float) -> None:
        """The partial was shed or refused: however quickly that was said, the hop doubles (up to the most)."""
        if self.ratio > 0:
            self.rtt_s = max(seconds, 2.0 * max(self.rtt_s, self.step_s / self.ratio))
