"""What a vocabulary is, whichever store keeps it (``store.py`` SQLite, ``redis_store.py`` Redis): its record, the
checks on what a client sends (gloss, kind, an export document), the form an example is stored in (its landmark
JSON written frame by frame with ``bigjson``, its features as float32 bytes), the export document spliced from the
stored text, and the quota refusals both stores raise (``quota_exceeded``, ``details.limit`` naming which).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from ..errors import InvalidParameter, NotFound, QuotaExceeded
from ..json_types import JSONObject
from . import bigjson
from .landmarks import LandmarkSeq
from .normalise import KINDS, LENGTH, features

EXPORT_FORMAT = "linguafusion-vocabulary/1"
MAX_GLOSS = 64
MAX_NAME = 100
MAX_CACHED = 64  # recognisers kept built (a large vocabulary's is a few MB)


class VocabularyJSON(TypedDict):
    """A vocabulary as the API shows it (``Vocabulary.to_dict``)."""

    vocabulary_id: str
    name: str
    kind: str
    lang: str
    created: float
    examples: int
    glosses: int


class ExampleJSON(TypedDict):
    """One example in a vocabulary's listing (``examples``)."""

    example_id: str
    gloss: str
    frames: int
    created: float


class AddedExample(TypedDict):
    """The answer of ``add_example``."""

    example_id: str
    gloss: str
    frames: int
    duration_s: float


@dataclass(frozen=True)
class Vocabulary:
    vocab_id: str
    name: str
    kind: str
    lang: str
    created: float
    examples: int = 0
    glosses: int = 0

    def to_dict(self) -> VocabularyJSON:
        return {"vocabulary_id": self.vocab_id, "name": self.name, "kind": self.kind, "lang": self.lang,
                "created": round(self.created, 3), "examples": self.examples, "glosses": self.glosses}


@dataclass(frozen=True)
class StoredExample:
    """One example as a store keeps it: what ``copy_vocabularies`` moves from one store to another unchanged."""

    example_id: str
    gloss: str
    frames: str  # the landmark JSON text (``frames_text``)
    n_frames: int
    created: float
    features: bytes  # float32, LENGTH rows (``blob``)

    @property
    def size(self) -> int:
        """Bytes it counts against its owner's ``max_bytes``."""
        return len(self.frames.encode("utf-8"))


@dataclass(frozen=True)
class ParsedImport:
    """An export document, checked: every example ready to store."""

    name: str
    kind: str
    lang: str
    examples: list[tuple[str, str, int, bytes]]  # gloss, frames text, frame count, features

    @property
    def size(self) -> int:
        return sum(len(text.encode("utf-8")) for _g, text, _n, _f in self.examples)


def new_vocab_id() -> str:
    return "vo_" + secrets.token_hex(6)


def new_example_id() -> str:
    return "ex_" + secrets.token_hex(6)


def check_gloss(gloss: object) -> str:
    if not isinstance(gloss, str) or not gloss.strip():
        raise InvalidParameter("'gloss' must be a non-empty string (the sign's or word's label)",
                               details={"field": "gloss"})
    g = " ".join(gloss.split())
    if len(g) > MAX_GLOSS or not g.isprintable() or g.lower() == "unknown":
        raise InvalidParameter(f"'gloss' must be printable, at most {MAX_GLOSS} characters, and not 'unknown'",
                               details={"field": "gloss"})
    return g


def check_kind(kind: object) -> str:
    if kind not in KINDS:
        raise InvalidParameter(f"'kind' must be one of {list(KINDS)}", details={"field": "kind"})
    return str(kind)


def clean_name(name: object, kind: str) -> str:
    return " ".join(str(name or kind).split())[:MAX_NAME] or kind


def blob(feats: np.ndarray) -> bytes:
    """An example's features as stored: float32 bytes, LENGTH rows."""
    return np.ascontiguousarray(feats, dtype=np.float32).tobytes()


def unblob(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.float32).reshape(LENGTH, -1)


def frames_text(seq: LandmarkSeq) -> str:
    """A sequence's JSON form as stored: written frame by frame (``bigjson``)."""
    return "[" + ",".join(bigjson.dumps(frame).decode("utf-8") for frame in seq.iter_json()) + "]"


def text_features(text: str, kind: str) -> np.ndarray:
    """The features of stored landmark JSON (what an example's row lacked before features were kept)."""
    return features(LandmarkSeq.from_json(bigjson.loads(text.encode("utf-8"))), kind)


def prepare_example(seq: LandmarkSeq, kind: str) -> tuple[str, np.ndarray]:
    """The text to store and its features: those of what is stored (its JSON rounds coordinates), as an export
    imported elsewhere computes them. Refuses a sequence this kind cannot use (no hands in a sign, no lips)."""
    features(seq, kind)
    text = frames_text(seq)
    return text, text_features(text, kind)


def parse_import(doc: object, max_examples: int) -> ParsedImport:
    """An export document checked whole: a bad example refuses the import before anything is written."""
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise InvalidParameter(f"not a vocabulary export: 'format' must be {EXPORT_FORMAT!r}",
                               details={"field": "format"})
    kind = check_kind(doc.get("kind"))
    items = doc.get("examples")
    if not isinstance(items, list):
        raise InvalidParameter("'examples' must be a list of {gloss, frames}", details={"field": "examples"})
    if len(items) > max_examples:
        raise too_many_examples(max_examples)
    parsed: list[tuple[str, LandmarkSeq, bytes]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidParameter(f"examples[{i}] is not an object", details={"field": f"examples[{i}]"})
        seq = LandmarkSeq.from_json(item.get("frames"))
        feats = blob(features(seq, kind))
        parsed.append((check_gloss(item.get("gloss")), seq, feats))
    for field in ("name", "lang"):
        if doc.get(field) is not None and not isinstance(doc.get(field), str):
            raise InvalidParameter(f"'{field}' must be a string", details={"field": field})
    from .. import langs

    lang = langs.normalize(doc.get("lang") or "en", field="lang")
    return ParsedImport(str(doc.get("name") or kind), kind, lang,
                        [(g, frames_text(s), len(s), f) for g, s, f in parsed])


def export_bytes(vocab: Vocabulary, rows: Iterable[tuple[str, str]]) -> bytes:
    """The export document as JSON bytes, spliced from ``rows`` (gloss, stored frames text, in the order taught),
    which ``add_example`` and ``import_`` wrote from a checked ``LandmarkSeq``: nothing is parsed again."""
    head = json.dumps({"format": EXPORT_FORMAT, "name": vocab.name, "kind": vocab.kind, "lang": vocab.lang},
                      ensure_ascii=False)
    examples = ",".join('{"gloss":' + json.dumps(g, ensure_ascii=False) + ',"frames":' + f + "}" for g, f in rows)
    return (head[:-1] + ',"examples":[' + examples + "]}").encode("utf-8")


def export_doc(data: bytes) -> JSONObject:
    """The export document (the SDK's local mode; the REST route sends the bytes): plain lists, as JSON."""
    doc: JSONObject = json.loads(data)
    return doc


# ---- refusals ------------------------------------------------------------------------------------------------
def not_found(vocab_id: str) -> NotFound:
    return NotFound(f"no vocabulary {vocab_id} for this key", details={"vocabulary_id": vocab_id})


def no_room(max_per_key: int) -> QuotaExceeded:
    return QuotaExceeded(f"this key has {max_per_key} vocabularies, the most it may keep; delete one "
                         "first (DELETE /v1/vocabularies/{id})", details={"limit": "max_vocabularies_per_key"})


def too_many_examples(max_examples: int) -> QuotaExceeded:
    return QuotaExceeded(f"a vocabulary holds at most {max_examples} examples",
                         details={"limit": "max_examples_per_vocabulary"})


def too_many_bytes(used: int, adding: int, max_bytes: int) -> QuotaExceeded:
    return QuotaExceeded(f"this key's vocabularies hold {used} bytes of landmarks and may hold at most "
                         f"{max_bytes}; this would add {adding}: delete examples or vocabularies first",
                         details={"limit": "max_vocabulary_bytes_per_key", "used": used, "adding": adding,
                                  "max": max_bytes})


def untaught(vocab_id: str) -> InvalidParameter:
    return InvalidParameter(f"vocabulary {vocab_id} has no examples yet: teach it first "
                            "(POST /v1/vocabularies/{id}/examples)", details={"vocabulary_id": vocab_id})
