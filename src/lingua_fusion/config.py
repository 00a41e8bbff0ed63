"""Typed settings with sub-sections, from environment (LINGUAFUSION_*, nested with ``__``) and defaults.

Example: ``LINGUAFUSION_LIMITS__MAX_UPLOAD_BYTES=1000000``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "linguafusion"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "linguafusion"


class ServerSettings(BaseModel):
    host: str = "127.0.0.1"  # the address `serve` binds (`--host` overrides)
    port: int = 8000  # the port `serve` binds (`--port` overrides)
    auth: bool = True  # API keys required (`--no-auth` turns it off: loopback only)
    # with auth on, /metrics takes an admin key or this scrape token (`Authorization: Bearer <token>`), so that a
    # Prometheus scraper needs no key that can mint keys; unset: admin keys only. At least 16 characters
    metrics_token: str | None = Field(default=None, min_length=16)
    request_timeout_s: float = 300.0  # a file request past this gets 504 timeout
    model_timeout_s: float = 30.0  # a model batch that takes longer than this (and the factor below) is abandoned
    model_timeout_factor: float = 10.0  # ... and this times its predicted cost: its items failed and retried
    max_concurrent_requests: int = 8  # file requests translated at once
    max_waiting_requests: int = 32  # file requests queued beyond those; more get 429 overloaded
    # file requests' threads (decoding a video's frames, its audio) run this much nicer than the server, so live
    # streams get the CPU first (Linux: per thread, inherited by the decoder's own threads); 0: the same priority
    file_nice: int = Field(default=10, ge=0, le=19)
    max_streams: int = 256  # live streams admitted at once, all keys together
    # `serve --workers`: a worker's large arrays (a partial's audio window, a picture) reach its model process
    # through a shared-memory ring both map (serving/shard/shm.py) instead of the socket; false: always the socket
    shm_ring: bool = True
    # `serve --workers`: each worker listens on its own socket of the port (SO_REUSEPORT), and the kernel spreads
    # connections evenly over them; false: one socket all workers accept on, where the first awake takes the most
    reuse_port: bool = True
    # `serve --workers`: a worker whose event loop has not run for this long (wedged, stopped) is killed and started
    # again; with a socket per worker, its share of new connections waits on it meanwhile. 0: never
    worker_stall_s: float = Field(default=10.0, ge=0)
    max_streams_per_key: int = 32  # live streams one key may hold at once
    stream_idle_timeout_s: float = 60.0  # a stream that sends nothing this long is closed (4408)
    drain_timeout_s: float = 10.0  # on SIGTERM, how long live streams get to finish
    # how often each process asks the key store whether a key with live streams here was revoked elsewhere (by
    # another worker of `serve --workers`, another server on the state directory, `keys revoke`): api/revocation.py;
    # and the stream store whether a stream live here was resumed elsewhere: api/takeover.py
    key_check_interval_s: float = Field(default=1.0, gt=0)
    # who this server is in a cluster's metrics (metrics_view.py): set, /metrics labels every sample with replica
    # and role (a cluster gateway sets both itself); with state.redis_url each server publishes its page every
    # metrics_publish_interval_s for the cluster view (GET /metrics/cluster), named replica or host:port
    replica: str = ""
    role: str = "server"
    metrics_publish_interval_s: float = Field(default=5.0, gt=0)
    # partials spaced by load (stream/policy.py PartialPacer): a stream's next partial waits this many times its
    # partials' round trip (a mean of the last few; doubled at each one shed), at least its class's step and at
    # most its max utterance length; 0: every step
    partial_pace: float = Field(default=2.5, ge=0)
    # the pace grows with the round trip up to partial_pace_full, reached at partial_pace_full_rtt of the stream's
    # SLO target (a round trip of 0.4 s at interactive's 1 s); at or under partial_pace: a constant pace
    partial_pace_full: float = Field(default=0.0, ge=0)
    partial_pace_full_rtt: float = Field(default=0.4, gt=0)
    breaker_window_s: float = 5.0  # the SLO breaker's latency windows (docs/reliability.md)
    breaker_k: int = 3  # windows in a row over target that move a class one step down the ladder
    chaos: bool = False  # fault injection at /v1/admin/faults (admin key); never on by default
    max_ws_message_bytes: int = 4 * 1024 * 1024  # also the WebSocket frame limit given to uvicorn (ws_max_size)
    max_ws_messages_per_s: float = 50.0  # per stream, averaged over 2 s (real time is 4-8 audio messages/s)
    max_images_in_flight: int = 8  # decoded slide frames held at once, all streams together (2 per stream)
    # Host / Origin allow-lists (api/guard.py). None = the default: anything with auth on; with --no-auth the
    # loopback names only, and Origin only the server's own (a page elsewhere cannot drive a keyless server)
    allowed_hosts: list[str] | None = None
    allowed_origins: list[str] | None = None
    # connections (api/server.py, `linguafusion serve`): a request's head must arrive within header_timeout_s of
    # the connection (or of the previous response); beyond max_connections new connections are closed at once
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_connections: int = 512


class LimitSettings(BaseModel):
    max_upload_bytes: int = 100 * 1024 * 1024  # a file request's body at most (413 too_large)
    max_media_seconds: float = 3600.0  # audio or video length at most (413)
    max_image_pixels: int = 40_000_000  # an image's width x height at most (413)
    max_image_side: int = 16_384  # an image's longer side at most (413)
    max_text_chars: int = 20_000  # REST text and file requests, and each text message of a stream
    # a stream's audio (stream/budget.py): at most this many times real time on average (beyond: its reads wait)
    max_audio_speed: float = Field(default=4.0, gt=0)
    # ... in bursts of at most this many audio seconds, which is also the most one message may carry (413 too_large)
    max_audio_burst_s: float = Field(default=30.0, gt=0)
    # pixels of images and video frames one key's streams may have decoded per second, together (beyond: reads wait;
    # serve --workers N: each worker paces the key's streams there at 1/N of it)
    max_key_pixels_per_s: float = Field(default=16_000_000.0, gt=0)
    max_glossary_terms: int = 5_000  # terms in one glossary at most
    max_glossary_bytes: int = 2_000_000  # a glossary upload's size at most
    max_glossaries_per_key: int = 100  # glossaries one key may keep (403 quota_exceeded)
    max_json_bytes: int = 64 * 1024  # JSON bodies (/v1/keys, /v1/admin/faults) and any body of other routes
    # every JSON body, stream message and glossary file, measured before it is parsed (json_bounds.py; 413
    # too_large): containers open at once at most (landmark JSON nests 7 deep) ...
    max_json_depth: int = Field(default=64, ge=1)
    # ... and elements at most (the [, { and , outside strings: about the values); the landmark routes take
    # vision.max_json_elements. 4 MiB of [],[],... is 2.8 million, 0.4 s of parsing holding the interpreter lock
    max_json_elements: int = Field(default=100_000, ge=1)
    max_listener_tokens_per_room: int = Field(default=10_000, ge=1)  # more: quota_exceeded


class ModelSettings(BaseModel):
    cache_dir: Path = Field(default_factory=default_cache_dir)  # where the set-up assembles the models
    asr_compute_type: str = "int8"  # CTranslate2's compute type for Whisper
    asr_threads: int = 2  # CPU threads per Whisper call (and the LLM worker's)
    # Whisper batches (ctranslate2 backend) that run at once, each on its own executor lane: CTranslate2 runs that
    # many generate calls in parallel (num_workers) and asr_threads is split between them. 0 = min(2, cores).
    # Default 1: on the shared 2-core test machine 2 lanes did not raise the knee (docs/benchmarks.md, issue 12 fig. 4)
    asr_parallel: int = Field(default=1, ge=0, le=16)
    asr_beam_size: int = 1
    backend: str = "ctranslate2"  # ASR engine: "ctranslate2" (faster-whisper, int8) or "torch" (models/whisper_torch)
    device: str = "cpu"  # "cpu" or "cuda" (the torch backend only)
    # the GPU engine's paged KV pools take this share of the GPU memory free at start, after the weights
    # (serving/gpu/memory.py, GpuRunner.sized); the rest is left to activations and the CUDA graphs
    gpu_memory_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    # the share of that this process's pools may take, of the GPU's total memory (``serve --model-processes M`` gives
    # each model process 1/M: they start together, so "free at start" alone would give the first one the most)
    gpu_memory_share: float = Field(default=1.0, gt=0.0, le=1.0)
    # "continuous": live streams' ASR runs on the continuous-batching engine (serving/gpu/server.py) on ``device``,
    # from the same Whisper weights in torch; "" (the default): the ``backend`` runners
    engine: str = ""
    # VAD with the engine on a CUDA device: "energy" (a level threshold) or "silero" (Silero v6 in torch, every
    # stream's windows in one batched call: serving/gpu/silero.py); on the CPU the engine keeps Silero on onnxruntime.
    # Under serve --workers with vad_in_workers each worker runs it: "energy" in numpy, "silero" on onnxruntime
    gpu_vad: Literal["energy", "silero"] = "energy"
    # the engine's Whisper encoder on CUDA replayed from CUDA graphs (serving/gpu/encoder_graphs.py), captured on the
    # ASR runner's thread when it is built (at start for ``engine_warm``); applies on CUDA alone. On the H200 this
    # path, with the shipped tiny.en weights, gave the CPU's transcripts with the graphs on and off
    # (bench/results/gpu_server_path.json), and the benchmark's encoder graphs took four model processes from 600 to
    # 900 streams at caption p99 <= 1 s
    encoder_graphs: bool = True
    # the engine's decode steps on CUDA replayed from CUDA graphs (serving/gpu/graphs.py), one per batch bucket up to
    # 1,024 rows, captured on each runner's thread when it is built (Whisper's and a user MT directory's); applies on
    # CUDA with the Triton paged attention alone (else the steps run eagerly, with a warning). A step of tiny.en
    # eagerly is about a hundred kernel launches from the runner's thread, a graph is one
    step_graphs: bool = True
    # the most rows a decode step and windows an encoder batch of the engine's CUDA runners take (1,024 / 128 at
    # most); 1 serves one item at a time, unbatched: the per-stream baseline its benchmark compares against
    engine_max_batch: int = Field(default=1024, ge=1, le=1024)
    # while a CUDA runner has sequences decoding, new items wait up to this many milliseconds for 8 to share one
    # encoder batch (its host cost is per batch more than per item); 0: each turn of the runner starts what has come
    engine_gather_ms: float = Field(default=0.0, ge=0.0, le=100.0)
    # a CUDA runner's turn that starts new items launches its decode step first and does the items' encoder batch
    # (its host work) while the step runs, then takes the step's tokens: the thread's wait for the GPU overlaps work
    step_overlap: bool = False
    # Python's switch interval in each model process (``serve --model-processes``), in ms (None: Python's 5 ms): how
    # long a GPU runner thread back from waiting for its step may wait for the lock while another thread (the other
    # runner, the VAD, the event loop) holds it. For a benchmark's A/B; unmeasured in the product server
    switch_interval_ms: float | None = Field(default=None, gt=0.0, le=100.0)
    # serve --workers: each stream worker runs its own streams' VAD (the one its model process would run:
    # serving/shard/worker_vad.py; Silero adds ~55 MiB a worker) on a thread of its own, as a cluster gateway does,
    # instead of a round trip to the model process per audio message: those were most of the messages the model
    # processes decoded, on the event loop and lock their GPU runner threads share. False: the model process runs it
    vad_in_workers: bool = True
    # languages whose engine ASR runner is built when the server (or each model process) starts, not at the
    # language's first stream, whose first captions would wait for it (10-25 s on an H200: weights, pools, graph
    # captures); None: English on a CUDA device, none on the CPU. /readyz answers 503 until they are built
    engine_warm: list[str] | None = None
    ocr_engine: str = "rapidocr"  # or "tesseract"
    llm: bool = True  # use the Gemma 270M fallback when installed
    # the LLM runs in a supervised worker process (models/mt_llm.py, supervise/): a crash or a hang there costs
    # only the batch in flight. Deadlines: the worker's start (load) and each batch, per text in it
    llm_start_timeout_s: float = Field(default=60.0, gt=0)
    llm_timeout_per_text_s: float = Field(default=20.0, gt=0)
    # a worker that crashes worker_loop_crashes times within worker_loop_window_s is a crash loop: its route is
    # unavailable for worker_cooldown_s (named in /readyz, /v1/models, `linguafusion models`), then tried again
    worker_loop_crashes: int = Field(default=3, ge=1)
    worker_loop_window_s: float = Field(default=60.0, gt=0)
    worker_cooldown_s: float = Field(default=30.0, gt=0)
    user_mt_dirs: list[Path] = Field(default_factory=list)

    def engine_warm_langs(self) -> list[str]:
        """``engine_warm`` resolved: [] when the engine is off."""
        if self.engine != "continuous":
            return []
        if self.engine_warm is not None:
            return list(dict.fromkeys(self.engine_warm))
        return ["en"] if self.device.startswith("cuda") else []

    def asr_lanes(self) -> int:
        """``asr_parallel`` resolved: 0 means min(2, the cores this process may use)."""
        if self.asr_parallel:
            return self.asr_parallel
        try:
            cores = len(os.sched_getaffinity(0))  # the cores this process may use (a container's share)
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
        return max(1, min(2, cores))

    @field_validator("ocr_engine")
    @classmethod
    def _ocr(cls, v: str) -> str:
        if v not in {"rapidocr", "tesseract"}:
            raise ValueError("ocr_engine must be rapidocr or tesseract")
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        if v not in {"", "continuous"}:
            raise ValueError("engine must be empty or continuous")
        return v

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in {"ctranslate2", "torch"}:
            raise ValueError("backend must be ctranslate2 or torch")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v != "cpu" and not v.startswith("cuda"):
            raise ValueError("device must be cpu or cuda[:N]")
        return v


class StateSettings(BaseModel):
    # keys, glossaries, vocabularies, the stream log (SQLite; the last two in Redis when redis_url is set)
    state_dir: Path = Field(default_factory=default_state_dir)

    redis_url: str | None = None  # a Redis: stream log, rooms, shared translation memory, vocabularies
    retention_s: float = 3600.0  # closed streams stay resumable / readable this long, then compaction drops them
    max_log_finals: int = 10_000  # a live stream's log keeps its last N finals (its snapshot holds the rest)
    compact_interval_s: float = 300.0  # how often the stream log drops what it no longer needs
    log_wait_s: float = 0.5  # a final waits this long for its log write, then goes out marked durable: false


class OtelSettings(BaseModel):
    """OpenTelemetry traces (lingua_fusion/tracing, docs/observability.md): off unless ``endpoint`` is set."""

    endpoint: str | None = None  # OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (/v1/traces is added)
    service_name: str = "linguafusion"  # the service name on exported spans
    headers: dict[str, str] = Field(default_factory=dict)  # sent with every export (a collector's auth token)
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)  # of traces kept; a client's traceparent decides its own
    max_queue: int = Field(default=2048, ge=1)  # spans waiting for export; beyond it new spans are dropped
    export_interval_s: float = Field(default=2.0, gt=0)  # how often spans are exported
    timeout_s: float = Field(default=10.0, gt=0)  # one export (and the flush at shutdown)


class VisionSettings(BaseModel):
    """Sign and lip landmarks (lingua_fusion/vision, docs/video.md): the mediapipe worker and the vocabularies."""

    python: Path | None = None  # the worker's interpreter (with mediapipe==0.10.21); None: .venv-vision, then this one
    timeout_s: float = Field(default=30.0, gt=0)  # one extraction request to the worker
    start_timeout_s: float = Field(default=90.0, gt=0)  # the worker's first answer (it imports mediapipe)
    max_side: int = Field(default=640, ge=64)  # frames are downscaled to this before extraction
    example_fps: float = Field(default=15.0, gt=0, le=60)  # frames read from an uploaded example video
    max_example_seconds: float = Field(default=20.0, gt=0)  # an example (or recognised) video's frames read at most
    max_vocabularies_per_key: int = Field(default=20, ge=1)  # sign / lip vocabularies one key may keep
    max_examples_per_vocabulary: int = Field(default=500, ge=1)  # examples one vocabulary may hold
    max_vocabulary_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)  # a JSON body (examples, import)
    # elements in such a body at most (limits.max_json_elements elsewhere): 16 MiB of landmark frames as written by
    # LandmarkSeq.iter_json (5 decimals, compact) measured 2.8 million; one example of 2,000 frames is 0.7 million
    max_json_elements: int = Field(default=4_000_000, ge=1)
    max_vocabulary_bytes_per_key: int = Field(default=256 * 1024 * 1024, ge=1024)  # stored landmark JSON, all vocabs


class RoomSettings(BaseModel):
    """Rooms (lingua_fusion/rooms, docs/rooms.md): how many a key may hold and how long they are kept, in memory as
    on Redis. A listener token lives as long as its room's record (``limits.max_listener_tokens_per_room`` a room)."""

    max_open_per_key: int = Field(default=100, ge=1)  # rooms waiting or live per key; more: 403 quota_exceeded
    # ended rooms (their history, readable by their tokens) kept per key: past it the oldest ended one is forgotten
    max_ended_per_key: int = Field(default=20, ge=0)
    # an ended room is forgotten this long after it ended (not_found after): long enough for a listener that lost
    # its connection near the end to reconnect with after_seq and get the last finals, short enough that history
    # handed out with a token does not stay readable for a day
    ended_ttl_s: float = Field(default=3600.0, gt=0)
    # a waiting or live room is forgotten this long after its last write (created, published into, a token minted;
    # a live room's publisher pushes it on every 10 minutes)
    ttl_s: float = Field(default=24 * 3600.0, gt=0)


class DiarizeSettings(BaseModel):
    """Speaker diarization of files (``diarize=true``) and live streams (start message ``diarize: true``),
    docs/diarization.md: the clusterer and its bounds."""

    # the most speakers a file or a stream may be given (a request's or start message's max_speakers may only lower
    # it); past it a voice joins the closest speaker, with a low speaker_confidence
    max_speakers: int = Field(default=8, ge=1, le=32)
    # the longest speech diarized (seconds of decoded audio); longer: 413 too_large before any ASR
    max_audio_s: float = Field(default=3 * 3600.0, gt=0)
    # cosine similarity a segment's voice needs to join a speaker; below it opens a new one (bench/diarize.py)
    threshold: float = Field(default=0.80, ge=-1.0, le=1.0)
    window_hop_s: float = Field(default=0.4, gt=0, le=1.6)  # between a segment's 1.6 s embedding windows
    max_windows_per_segment: int = Field(default=16, ge=1, le=256)  # a long segment's windows, evenly spread
    # a stream's bar (one online pass, each utterance's embedding judged once, as it is heard): an utterance's whole
    # voice against a speaker's centroid; same synthetic voice across sentences 0.77-0.85, other voices <= 0.67
    # (docs/diarization.md, "Live streams")
    stream_threshold: float = Field(default=0.72, ge=-1.0, le=1.0)
    # a stream's utterance is embedded as at most this many 1.6 s windows (evenly spread): one work item on the
    # engine's spk key, batched with other streams' (at most 8 items a batch), so a forward is <= 8 x this windows
    stream_max_windows: int = Field(default=8, ge=1, le=64)


class TmSettings(BaseModel):
    """The translation memory (lingua_fusion/tm, docs/rooms.md): a local LRU, then Redis (``state.redis_url``)."""

    enabled: bool = True  # the translation memory on or off
    local_entries: int = Field(default=50_000, ge=1)  # entries kept in this process's memory
    local_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # bytes kept in this process's memory
    local_ttl_s: float = Field(default=6 * 3600.0, gt=0)  # how long an entry stays in this process's memory
    shared: bool = True  # use Redis too when the server has one
    shared_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)  # how long an entry stays in Redis
    max_segment_chars: int = Field(default=2000, ge=1)  # longer segments are translated, not kept


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LINGUAFUSION_", env_nested_delimiter="__", extra="ignore")

    server: ServerSettings = Field(default_factory=ServerSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    models: ModelSettings = Field(default_factory=ModelSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    tm: TmSettings = Field(default_factory=TmSettings)
    rooms: RoomSettings = Field(default_factory=RoomSettings)
    otel: OtelSettings = Field(default_factory=OtelSettings)
    vision: VisionSettings = Field(default_factory=VisionSettings)
    diarize: DiarizeSettings = Field(default_factory=DiarizeSettings)
    state_dir: Path | None = None  # LINGUAFUSION_STATE_DIR shortcut

    def resolved_state_dir(self) -> Path:
        return self.state_dir or self.state.state_dir
