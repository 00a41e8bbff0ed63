"""What model work costs before it is measured: a stream's demand per model (admission), each model's starting
cost model, an item's work units (fairness and batch bounds). Pure: a worker process of ``serve --workers``
computes a stream's demand here without importing the executor (serving/shard/remote.py)."""

from __future__ import annotations

from collections.abc import Sequence, Sized

from ..errors import Overloaded
from .cost_model import CostModel
from .keys import ModelKey
from .ports import MtInput, TranscribeInput
from .rates import COMMITTED_RATE
from .scheduler import Demand, Scheduler
from .service_curve import ServiceCurve

# starting cost models (seconds, measured on 2 cores); refined online from every batch. Matched by prefix, in order:
# language identification (asr:base:auto, one encoder pass and one decoder step) before base's transcriptions
PRIOR_COSTS = {"asr:tiny.en": (0.07, 0.08), "asr:base:auto": (0.08, 0.04), "asr:base": (0.15, 0.15),
               "mt": (0.05, 0.01), "ocr": (0.5, 0.5), "tts": (0.1, 0.2), "spk": (0.05, 0.05)}
# an ASR batch's work units: a stream's utterance is 1, a file's piece (TranscribeInput) at least this, so a piece
# runs in a batch of its own and no stream's utterance waits inside a batch for a file's 30 s of speech
ASR_MAX_UNITS = 8.0
MT_BATCH_CHARS = 3000  # characters per MT batch (about 0.1 s of Apertium on 2 cores); one longer item runs alone


def stream_demand(stream_id: str, slo: str, source: str, targets: list[str], partials: bool, step_s: float,
                  inputs: list[str], detect: Sequence[str] = (), diarize: bool = False) -> Demand[ModelKey]:
    """What a stream asks of each model (items/s), for admission. Pure: a worker process computes it too.

    ``detect``: the languages a stream started with ``source_lang: "auto"`` may speak. Each committed utterance is
    then identified once (``ModelKey.detect()``), and any one candidate may take all of the stream's speech: the
    speaker may keep to it, so each candidate's ASR and MT keys are reserved the whole rate (a worst case per
    key; at most 8 candidates, protocol.py). ``diarize``: each committed utterance's voice is embedded too
    (``ModelKey.spk()``, stream/speakers.py)."""
    rate: dict[ModelKey, float] = {}
    spoken = list(detect) or [source]
    if "audio" in inputs:
        # admission reserves capacity for committed work (~1 utterance per 3.3 s); tentative re-decodes use
        # what is left and are shed first, so they count at a quarter of their rate
        for lang in spoken:
            rate[ModelKey.asr(lang)] = COMMITTED_RATE + (0.25 / step_s if partials else 0.0)
        if detect:
            rate[ModelKey.detect()] = COMMITTED_RATE
        if diarize:
            rate[ModelKey.spk()] = COMMITTED_RATE
    for lang in spoken:
        for t in targets:
            if t != lang:
                rate[ModelKey.mt(lang, t)] = COMMITTED_RATE
    return Demand(stream_id, slo, rate)


def no_capacity(full: str, active_streams: int, slo: str | None = None, late_s: float = 0.0) -> Overloaded:
    """Admission's refusal (429 / 4429): ``full``, what is at its limit (a model's key such as ``asr:tiny.en``, or
    ``server.max_streams``), in the message and its details, so a client, the load generator's
    ``rejected_reasons`` and an operator see which part of the server is full; ``late_s``: the model owes a caption
    that far past its budget (serving/late.py), said as "behind" instead of "full"."""
    details: dict[str, object] = {"full": full, "active_streams": active_streams}
    if slo is not None:
        details["slo"] = slo
    if late_s > 0:  # behind for every class: a looser one would add to it too
        details["late_s"] = round(late_s, 3)
        return Overloaded(f"no capacity for another stream now ({full} is behind: a caption is late there); retry "
                          "later", retry_after=5.0, details=details)
    return Overloaded(f"no capacity for another stream at this SLO ({full} is full); retry later or use a looser SLO "
                      "class", retry_after=5.0, details=details)


def work_units(payload: object) -> float:
    """An item's work units for fairness and batch bounds: an MT item's characters; a file's piece of speech its
    seconds / 3 (a stream's utterance is about 3 s), at least a batch's worth; 1 for anything else."""
    if isinstance(payload, MtInput):
        return float(max(1, len(payload.text)))
    if isinstance(payload, TranscribeInput):
        return max(ASR_MAX_UNITS, len(payload.audio) / 16000 / 3)
    return 1.0


def prior_cost(key: str) -> CostModel:
    for prefix, (c0, c1) in PRIOR_COSTS.items():
        if key.startswith(prefix):
            return CostModel(c0, c1)
    return CostModel()


def vad_seconds(audio: object) -> float:
    """A VAD item's seconds of 16 kHz audio (its share of a VAD call)."""
    return len(audio) / 16000 if isinstance(audio, Sized) else 0.0


def model_scheduler(alpha: float, max_batch: int, max_queue: int) -> Scheduler[ModelKey]:
    """The executor's scheduler, with the bounds of a batch: Apertium translates a batch in one pipeline run (up to
    4 x ``max_batch`` items) of at most MT_BATCH_CHARS characters in all (one longer item runs alone), so a key's
    20,000-character messages cannot fill a batch that another key's caption then waits behind; a file's speech
    counts ASR_MAX_UNITS at least; one key never holds more than half a model's queue."""
    scheduler: Scheduler[ModelKey] = Scheduler(alpha=alpha, max_batch=max_batch, max_queue=max_queue)
    scheduler.batch_scale = {"mt": 4}
    scheduler.max_units = {"mt": MT_BATCH_CHARS, "asr": ASR_MAX_UNITS}
    scheduler.max_queue_per_key = max(1, max_queue // 2)
    return scheduler


def first_measures(scheduler: Scheduler[ModelKey], key: ModelKey, continuous: bool) -> None:
    """A model's measures before its first batch: its prior cost line; a continuous runner (it batches on its own,
    so it is handed everything scheduled at no modelled batch cost) is counted by admission from its items'
    latency against the items in flight (``Scheduler.service``), the prior until its items are seen."""
    prior = prior_cost(str(key))
    scheduler.costs.setdefault(key, CostModel(0.0, 0.0) if continuous else prior)
    if continuous:
        scheduler.service.setdefault(key, ServiceCurve(prior.c0, prior.c1))
