"""What the OpenAI-compatible routes share: which ``model`` names are served, OpenAI's error shape, and Whisper's
language names. The routes themselves are ``openai_audio.py`` (files) and ``openai_realtime.py`` (live audio);
what is supported and what is not: docs/openai.md.

Every ``model`` name goes to the same speech route that /v1/translate and /v1/streams use (Whisper tiny.en for
English, Whisper base for any other language, then MT when a translation is asked for): the names differ only in
what they restrict (``whisper-tiny.en`` takes English speech only). An unknown name is a 404 ``model_not_found``;
``gpt-4o-transcribe-diarize`` adds speaker diarization (files/diarize.py; ``response_format=diarized_json``).

Errors are answered in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with this server's
``details`` kept as an extra field; ``code`` is our stable code (errors.py) except where OpenAI's clients know
another one (``invalid_api_key``, ``model_not_found``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NotRequired, TypedDict

from .. import langs
from ..errors import InvalidParameter, LinguaFusionError, NotFound
from ..json_types import JSONObject, json_object

# names of the auto route: OpenAI's transcription models and ours
AUTO = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-4o-mini-transcribe-2025-12-15",
        "gpt-transcribe", "gpt-live-transcribe", "gpt-realtime-whisper", "linguafusion")
ENGLISH_ONLY = ("whisper-tiny.en",)
DIARIZE = ("gpt-4o-transcribe-diarize",)  # the auto route, each segment's speaker found (diarize=true)
UNSUPPORTED: dict[str, str] = {}  # known OpenAI names for what this server lacks: name -> why (a 400)
# realtime (conversation) model names a client may put in the realtime URL; this server opens a transcription
# session for them (it has no speech-to-speech model)
REALTIME_PREFIXES = ("gpt-realtime", "gpt-4o-realtime", "gpt-4o-mini-realtime")
# our request fields -> the OpenAI field a client sent
PARAMS = {"source_lang": "language", "target_lang": "target_language", "source_modality": "file",
          "enable_glossary": "glossary_id"}


@dataclass(frozen=True)
class SpeechModel:
    """What a ``model`` name means here."""

    name: str
    english_only: bool = False
    diarize: bool = False  # each segment's speaker (response_format diarized_json shows them)

    def language(self, requested: str | None) -> str | None:
        """The spoken language to pass on: the requested one (None: detected), checked against the model."""
        if not self.english_only:
            return requested
        if requested is not None and langs.normalize(requested, field="source_lang") != "en":
            raise InvalidParameter(f"{self.name} transcribes English only; use whisper-1 for {requested!r}",
                                   details={"field": "language"})
        return "en"


def served_models() -> list[str]:
    return [*AUTO, *ENGLISH_ONLY, *DIARIZE]


def speech_model(name: str | None, *, field: str = "model") -> SpeechModel:
    """The model for an OpenAI ``model`` name: 400 when missing or unsupported, 404 when unknown."""
    name = (name or "").strip()
    if not name:
        raise InvalidParameter(f"{field} is required (e.g. whisper-1)", details={"field": field})
    if name in AUTO:
        return SpeechModel(name)
    if name in ENGLISH_ONLY:
        return SpeechModel(name, english_only=True)
    if name in DIARIZE:
        return SpeechModel(name, diarize=True)
    if name in UNSUPPORTED:
        raise InvalidParameter(f"{name}: {UNSUPPORTED[name]}", details={"field": field})
    raise NotFound(f"the model {name[:64]!r} does not exist here; served: {', '.join(served_models())}",
                   details={"field": field, "models": served_models()})


def realtime_model(name: str) -> SpeechModel:
    """A realtime URL's ``model``: a transcription model, or a realtime model name (transcription only here)."""
    if name.startswith(REALTIME_PREFIXES):
        return SpeechModel("whisper-1")
    return live_model(name)


def live_model(name: str | None, *, field: str = "model") -> SpeechModel:
    """A transcription model for live audio: diarization is for files here (a 400 says so)."""
    model = speech_model(name, field=field)
    if model.diarize:
        raise InvalidParameter(f"{model.name}: speaker diarization is for files here (/v1/audio/transcriptions), "
                               "not live sessions", details={"field": field})
    return model


# ---- errors --------------------------------------------------------------------------------------------------
def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    return "invalid_request_error" if status < 500 else "server_error"


class OpenAIError(TypedDict):
    """OpenAI's error object (``error`` of an error body or of a realtime ``error`` event)."""

    message: str
    type: str
    param: str | None
    code: str
    details: NotRequired[JSONObject]  # ours (errors.py), kept as an extra field


def openai_error(err: LinguaFusionError) -> OpenAIError:
    """The ``error`` object of OpenAI's error shape for ``err`` (our details kept as an extra field)."""
    named = err.details.get("field")
    field = named if isinstance(named, str) else None
    param = PARAMS.get(field, field) if field else None
    code = err.code
    if err.code == "unauthenticated":
        code = "invalid_api_key"
    elif isinstance(err, NotFound) and param == "model":
        code = "model_not_found"
    body: OpenAIError = {"message": err.public_message, "type": error_type(err.status), "param": param,
                            "code": code}
    if err.details:
        body["details"] = json_object(err.details)
    return body


# ---- language names (Whisper's, as OpenAI's verbose_json writes them) ---------------------------------------
WHISPER_NAMES = dict(pair.split("=") for pair in (
    "en=english zh=chinese de=german es=spanish ru=russian ko=korean fr=french ja=japanese pt=portuguese "
    "tr=turkish pl=polish ca=catalan nl=dutch ar=arabic sv=swedish it=italian id=indonesian hi=hindi fi=finnish "
    "vi=vietnamese he=hebrew uk=ukrainian el=greek ms=malay cs=czech ro=romanian da=danish hu=hungarian "
    "ta=tamil no=norwegian th=thai ur=urdu hr=croatian bg=bulgarian lt=lithuanian la=latin mi=maori "
    "ml=malayalam cy=welsh sk=slovak te=telugu fa=persian lv=latvian bn=bengali sr=serbian az=azerbaijani "
    "sl=slovenian kn=kannada et=estonian mk=macedonian br=breton eu=basque is=icelandic hy=armenian "
    "ne=nepali mn=mongolian bs=bosnian kk=kazakh sq=albanian sw=swahili gl=galician mr=marathi pa=punjabi "
    "si=sinhala km=khmer sn=shona yo=yoruba so=somali af=afrikaans oc=occitan ka=georgian be=belarusian "
    "tg=tajik sd=sindhi gu=gujarati am=amharic yi=yiddish lo=lao uz=uzbek fo=faroese ht=haitian_creole "
    "ps=pashto tk=turkmen nn=nynorsk mt=maltese sa=sanskrit lb=luxembourgish my=myanmar bo=tibetan "
    "tl=tagalog mg=malagasy as=assamese tt=tatar haw=hawaiian ln=lingala ha=hausa ba=bashkir jw=javanese "
    "su=sundanese yue=cantonese").split())
CODES = {name: code for code, name in WHISPER_NAMES.items()}


def language_name(code: str) -> str:
    """``es`` -> ``spanish`` (what OpenAI's verbose_json calls a language)."""
    return WHISPER_NAMES.get(code, code).replace("_", " ")


def language_code(value: object, *, field: str) -> str | None:
    """An ISO 639-1 code or a Whisper language name (``spanish``) -> our code (any other value: its ``str``); None
    when not given."""
    if value is None or not str(value).strip():
        return None
    v = str(value).strip().lower().replace(" ", "_")
    return langs.normalize(CODES.get(v, v), field=field)
