"""Request bodies and error responses for the OpenAPI document (/openapi.json).

The routes read their forms and JSON by hand (limits, clear errors), so FastAPI cannot infer these: they are
declared here and attached with ``openapi_extra``. tests/e2e/test_schemathesis.py generates requests from them.
"""

from __future__ import annotations

from ..json_types import JSONObject

ERROR: JSONObject = {"type": "object", "required": ["error"],
         "properties": {"error": {"type": "object", "required": ["code", "message"],
                                  "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                                                 "details": {"type": "object"}}}}}


def form_body(schema: JSONObject) -> JSONObject:
    return {"required": True, "content": {"multipart/form-data": {"schema": schema},
                                          "application/x-www-form-urlencoded": {"schema": schema}}}


def json_body(schema: JSONObject) -> JSONObject:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


TRANSLATE = form_body({
    "type": "object", "required": ["target_lang"], "anyOf": [{"required": ["text"]}, {"required": ["file"]}],
    "properties": {
        "text": {"type": "string", "description": "text to translate (or send a file)"},
        "file": {"type": "string", "format": "binary", "description": "audio, video, image or UTF-8 text"},
        "source_modality": {"enum": ["text", "audio", "speech", "video", "image", "slide"]},
        "target_modality": {"enum": ["text", "speech", "braille"]},
        "source_lang": {"type": "string", "description": "ISO 639-1; detected when left out"},
        "target_lang": {"type": "string", "description": "ISO 639-1"},
        "output_format": {"enum": ["json", "srt", "vtt", "text", "wav"]},
        "enable_glossary": {"enum": ["true", "false", "1", "0", "yes", "no", "on", "off"]},
        "glossary_id": {"type": "string"},
        "vocabulary_id": {"type": "string", "description": "a sign vocabulary of this key: a video's signs are read "
                                                           "(the result's signs)"},
        "diarize": {"enum": ["true", "false", "1", "0", "yes", "no", "on", "off"],
                    "description": "speech: each segment's speaker (segments[].speaker, S1, S2, ...)"},
        "max_speakers": {"type": "integer", "minimum": 1,
                         "description": "with diarize: at most this many speakers (cap: diarize.max_speakers)"},
        "word_timestamps": {"enum": ["true", "false", "1", "0", "yes", "no", "on", "off"],
                            "description": "speech: each segment's spoken words with their times (segments[].words; "
                                           "vtt: karaoke cues)"}}})
GLOSSARY = form_body({
    "type": "object", "anyOf": [{"required": ["terms"]}, {"required": ["file"]}],
    "properties": {"file": {"type": "string", "format": "binary", "description": "CSV (source,target) or JSON"},
                   "terms": {"type": "string", "description": "CSV text: source,target per line"},
                   "name": {"type": "string"}, "source_lang": {"type": "string"}, "target_lang": {"type": "string"}}})
FAULT = json_body({
    "type": "object",
    "properties": {"model": {"type": "string", "description": "asr, mt, ocr, tts, * or a model key (mt:en-es)"},
                   "kind": {"enum": ["delay", "error", "hang", "garbage"]},
                   "delay_s": {"type": "number", "minimum": 0, "maximum": 600},
                   "jitter_s": {"type": "number", "minimum": 0, "maximum": 60},
                   "fraction": {"type": "number", "minimum": 0, "maximum": 1},
                   "after": {"type": "integer", "minimum": 0, "maximum": 1_000_000}}})
KEY = json_body({
    "type": "object",
    "properties": {"name": {"type": "string"}, "scopes": {"type": "array", "items": {"enum": ["translate", "admin"]}}}})


def body(request_body: JSONObject) -> JSONObject:
    """``openapi_extra`` for a route: its request body and the error envelope every 4xx uses."""
    return {"requestBody": request_body,
            "responses": {"4XX": {"description": "a client error: a stable code and a message",
                                  "content": {"application/json": {"schema": ERROR}}}}}
