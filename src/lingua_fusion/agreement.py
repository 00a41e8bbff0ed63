"""Glossary terms that agree with their sentence (es, ca, fr, pt).

A glossary term is put where its placeholder came out of the MT engine, and the engine chose the words around the
placeholder without knowing the term: "I went to the bank." with ``{"bank": "orilla"}`` came out "Fui al [900]."
and became "Fui al orilla." Here the articles, determiners (contractions and elisions included) and adjectives
that go with the term take its gender and number, and so does an adjective after a copula ("es nuevo" -> "es
nueva"): "Fui a la orilla.", "La orilla del río es verde.", "une nouvelle école".

The morphology is Apertium's own (the Debian dictionaries the MT pairs install): an analyser gives each word's
lemma and tags (``al`` = ``a<pr>+el<det><def><m><sg>``, ``orilla`` = ``orilla<n><f><sg>``), the generator and the
post-generator write the re-inflected words (``a ~la orilla`` -> ``a la orilla``, ``de ~la école`` -> ``de
l'école``). The target language is read from the sentence (the language whose dictionary knows most of its words,
and the term). On any doubt (an unknown term, a word with no such reading, a dictionary missing) the term goes in
unchanged, as before.
"""

from __future__ import annotations

import logging
import os
import re
import select
import shutil
import subprocess
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger("lingua_fusion.agreement")

APERTIUM = Path("/usr/share/apertium")
# language -> (analyser, generator, post-generator), each a list of candidates: the first installed one is used
DICTIONARIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "es": (("apertium-eng-spa/spa-eng.automorf.bin", "apertium-fr-es/es-fr.automorf.bin"),
           ("apertium-eng-spa/eng-spa.autogen.bin", "apertium-fr-es/fr-es.autogen.bin"),
           ("apertium-eng-spa/eng-spa.autopgen.bin", "apertium-fr-es/fr-es.autopgen.bin")),
    "ca": (("apertium-eng-cat/cat-eng.automorf.bin", "apertium-fra-cat/cat-fra.automorf.bin"),
           ("apertium-eng-cat/eng-cat.autogen.bin", "apertium-fra-cat/fra-cat.autogen.bin"),
           ("apertium-eng-cat/eng-cat.autopgen.bin", "apertium-fra-cat/fra-cat.autopgen.bin")),
    "fr": (("apertium-fr-es/fr-es.automorf.bin", "apertium-fra-cat/fra-cat.automorf.bin"),
           ("apertium-fr-es/es-fr.autogen.bin", "apertium-fra-cat/cat-fra.autogen.bin"),
           ("apertium-fr-es/es-fr.autopgen.bin", "apertium-fra-cat/cat-fra.autopgen.bin")),
    "pt": (("apertium-es-pt/pt-es.automorf.bin",), ("apertium-es-pt/es-pt.autogen.bin",),
           ("apertium-es-pt/es-pt.autopgen.bin",)),
}
ENGLISH = ("apertium-eng-spa/eng-spa.automorf.bin", "apertium-eng-cat/eng-cat.automorf.bin")  # "none of them"
COPULAS = {"ser", "estar", "être", "ésser", "ficar", "parecer", "semblar", "sembler", "paraître", "quedar",
           "resultar", "esdevenir", "devenir", "tornar-se"}
CONJUNCTIONS = {"y", "e", "i", "et", "ou", "o"}
WORD = re.compile(r"[^\W\d_]+(?:['’](?=[^\W\d_])|['’]|-[^\W\d_]+)?")
LU = re.compile(r"\^(.*?)\$")
TAG = re.compile(r"<([^<>]+)>")
GENDERS, NUMBERS = {"m", "f", "mf", "GD", "nt"}, {"sg", "pl", "sp", "ND"}
MAX_LEFT = 3
TIMEOUT_S = 5.0  # one lt-proc answer; a stuck process is killed and the term goes in unchanged


class _LtProc:
    """One lt-proc process in null-flush mode: write a chunk ending in NUL, read its answer up to NUL."""

    def __init__(self, args: list[str]) -> None:
        self._args = args
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def run(self, chunks: list[str]) -> list[str]:
        with self._lock:
            for attempt in (1, 2):
                try:
                    return self._run(chunks)
                except (OSError, ValueError) as exc:  # a process that died: start it again once
                    self.close()
                    if attempt == 2:
                        raise OSError(f"lt-proc failed: {exc}") from exc
        return []  # pragma: no cover

    def _run(self, chunks: list[str]) -> list[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(b"".join(c.encode("utf-8") + b"\0" for c in chunks))
        self._proc.stdin.flush()
        fd = self._proc.stdout.fileno()
        out: list[str] = []
        buf = bytearray()
        while len(out) < len(chunks):
            ready, _, _ = select.select([fd], [], [], TIMEOUT_S)
            if not ready:
                raise ValueError(f"lt-proc gave no answer in {TIMEOUT_S:g} s")
            data = os.read(fd, 65536)
            if not data:
                raise ValueError("lt-proc closed its output")
            buf += data
            while b"\0" in buf and len(out) < len(chunks):
                done, _, rest = buf.partition(b"\0")
                out.append(done.decode("utf-8", "replace"))
                buf = bytearray(rest)
        return out

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def _installed(candidates: tuple[str, ...]) -> Path | None:
    return next((APERTIUM / c for c in candidates if (APERTIUM / c).exists()), None)


@cache
def _tool(mode: str, path: Path) -> _LtProc:
    return _LtProc(["lt-proc", "-z", *([mode] if mode else []), str(path)])


def _escape(text: str) -> str:
    return re.sub(r"([\[\]\^\$/\\@<>{}*#~+])", r"\\\1", text)


class Morphology:
    """One language's analyser, generator and post-generator."""

    def __init__(self, lang: str, analyser: Path, generator: Path | None, postgen: Path | None) -> None:
        self.lang = lang
        self._analyser = _tool("", analyser)
        self._gen = _tool("-g", generator) if generator else None
        self._post = _tool("-p", postgen) if postgen else None
        self._cache: dict[str, list[str]] = {}

    def analyse(self, words: list[str]) -> list[list[str]]:
        """Each word's readings ("lemma<tag><tag>", "a<pr>+el<det><def><m><sg>"); [] for an unknown word."""
        todo = sorted({w for w in words if w not in self._cache})
        if todo:
            for word, out in zip(todo, self._analyser.run([_escape(w) for w in todo]), strict=True):
                units = LU.findall(out)
                readings = units[0].split("/")[1:] if len(units) == 1 else []
                self._cache[word] = [] if not readings or readings[0].startswith("*") else readings
            if len(self._cache) > 20_000:
                self._cache.clear()
        return [self._cache.get(w, []) for w in words]

    def generate(self, stream: str) -> str | None:
        """Surface text for a mix of lexical units (``^el<det><def><f><sg>$``) and plain words; None when the
        generator does not know a form."""
        if self._gen is None or self._post is None:
            return None
        # lt-proc -g answers a chunk that ends with a lexical unit only after the next character: end with a blank
        out = self._gen.run([stream + " "])[0]
        if re.search(r"[#@]|\*\w", out):
            return None
        return self._post.run([out])[0].replace("~", "")[:-1]


@cache
def morphology(lang: str) -> Morphology | None:
    if shutil.which("lt-proc") is None or lang not in DICTIONARIES:
        return None
    analyser, generator, postgen = (_installed(c) for c in DICTIONARIES[lang])
    return Morphology(lang, analyser, generator, postgen) if analyser else None


@cache
def _english() -> Morphology | None:
    path = _installed(ENGLISH)
    return Morphology("en", path, None, None) if path and shutil.which("lt-proc") else None


# ---- reading the sentence ------------------------------------------------------------------------------------
@dataclass
class _Token:
    start: int
    end: int
    text: str


def _tokens(text: str) -> list[_Token]:
    return [_Token(m.start(), m.end(), m.group()) for m in WORD.finditer(text)]


def sentence_language(text: str) -> str | None:
    """es, ca, fr or pt when that dictionary knows most of the sentence's words (and more than English does)."""
    words = [t.text for t in _tokens(text)]
    if not words:
        return None
    scores: dict[str, float] = {}
    for lang in DICTIONARIES:
        m = morphology(lang)
        if m is not None:
            scores[lang] = sum(1 for r in m.analyse(words) if r) / len(words)
    english = _english()
    floor = sum(1 for r in english.analyse(words) if r) / len(words) if english else 0.0
    if not scores:
        return None
    best = max(scores.values())
    tied = [lang for lang, v in scores.items() if v == best]
    if best < 0.6 or best <= floor:
        return None
    if len(tied) > 1:
        from .langs import identify_among

        return identify_among(text, tied)
    return tied[0]


def _features(reading: str) -> tuple[str | None, str | None]:
    tags = TAG.findall(reading)
    gender = next((t for t in tags if t in GENDERS), None)
    number = next((t for t in tags if t in NUMBERS), None)
    return gender, number


def term_features(morph: Morphology, term: str) -> tuple[str | None, str | None]:
    """Gender (m / f) and number (sg / pl) of a term's head noun: its first word with a noun reading."""
    words = [t.text for t in _tokens(term)]
    for readings in morph.analyse(words):
        nouns = [r for r in readings if "<n>" in r or "<np>" in r]
        if not nouns:
            continue
        found = {_features(r) for r in nouns}
        genders = {g for g, _ in found if g in ("m", "f")}
        numbers = {n for _, n in found if n in ("sg", "pl")}
        return (genders.pop() if len(genders) == 1 else None), (numbers.pop() if len(numbers) == 1 else None)
    return None, None


def _reinflect(reading: str, gender: str | None, number: str | None) -> str | None:
    """``reading`` with the gender and number of its determiner / adjective part replaced; None if unchanged."""
    parts = reading.split("+")
    changed = False
    for i, part in enumerate(parts):
        tags = TAG.findall(part)
        if not tags or tags[0] not in ("det", "predet", "adj") and not (tags[0] == "vblex" and "pp" in tags):
            continue
        new = []
        for t in tags:
            if t in ("m", "f") and gender and t != gender:
                t, changed = gender, True
            elif t in ("sg", "pl") and number and t != number:
                t, changed = number, True
            new.append(t)
        parts[i] = part.split("<", 1)[0].lower() + "".join(f"<{t}>" for t in new)
    return "+".join(parts) if changed else None


def _pick(readings: list[str], kinds: tuple[str, ...]) -> str | None:
    for kind in kinds:
        for r in readings:
            if kind == "pr+det" and re.match(r"[^<]+<pr>\+[^<]+<det>", r):
                return r
            if kind != "pr+det" and TAG.findall(r)[:1] == [kind] and "+" not in r:
                return r
            if kind == "pp" and "<vblex>" in r and "<pp>" in r and "+" not in r:
                return r
    return None


def _units(reading: str) -> str:
    return " ".join(f"^{p}$" for p in reading.split("+"))


def _cased(new: str, old: str) -> str:
    return new[:1].upper() + new[1:] if old[:1].isupper() else new


# ---- the one entry point ----------------------------------------------------------------------------------------
def agree(text: str, key: str, target: str) -> str:
    """``text`` with each placeholder ``key`` replaced by the glossary ``target``, the words around it made to
    agree with the term when the sentence is Spanish, Catalan, French or Portuguese."""
    if key not in text:
        return text
    plain = text.replace(key, target)
    try:
        lang = sentence_language(plain)
        morph = morphology(lang) if lang else None
        if morph is None:
            return plain
        gender, number = term_features(morph, target)
        if gender is None and number is None:
            return plain
        while key in text:
            text = _agree_one(morph, text, key, target, gender, number)
        return text
    except OSError as exc:  # lt-proc missing or dying: the term still goes in, as it always did
        log.warning("glossary agreement skipped: %s", exc)
        return plain


def _agree_one(morph: Morphology, text: str, key: str, target: str, gender: str | None, number: str | None) -> str:
    at = text.index(key)
    before, after = text[:at], text[at + len(key):]
    left = _left(morph, before, target, gender, number)
    right = _right(morph, after, gender, number)
    return left + right


def _left(morph: Morphology, before: str, target: str, gender: str | None, number: str | None) -> str:
    """``before`` + the term, with the determiners and adjectives just before the term re-inflected."""
    tokens = _tokens(before)
    chain: list[tuple[_Token, str]] = []  # (token, reading), right to left
    end = len(before)
    readings = morph.analyse([t.text for t in tokens[-MAX_LEFT:]])
    for tok, rs in zip(reversed(tokens[-MAX_LEFT:]), reversed(readings), strict=True):
        if before[tok.end:end].strip():  # punctuation between: not the term's phrase
            break
        reading = _pick(rs, ("det", "pr+det", "predet", "adj"))
        if reading is None:
            break
        chain.append((tok, reading))
        end = tok.start
        if "<pr>" in reading:
            break
    if not any("<det>" in r or "<predet>" in r for _, r in chain):
        return before + target
    start = chain[-1][0].start
    pieces, changed = [], False
    for tok, reading in reversed(chain):
        new = _reinflect(reading, gender, number)
        changed = changed or new is not None
        pieces.append(_units(new) if new else _escape(tok.text))
    if not changed:
        return before + target
    joiner = "" if before.endswith(("'", "’")) else " "
    out = morph.generate(" ".join(pieces) + joiner + _escape(target))
    if out is None or not out.endswith(target):
        return before + target
    return before[:start] + _cased(out, chain[-1][0].text)


def _right(morph: Morphology, after: str, gender: str | None, number: str | None) -> str:
    """``after`` with the adjectives that follow the term (and one after a copula) re-inflected."""
    tokens = _tokens(after)[:8]
    analyses = morph.analyse([t.text for t in tokens])
    edits: list[tuple[_Token, str]] = []
    i, end = 0, 0
    # adjectives (and participles) right after the term, "y"/"et" between them
    while i < len(tokens) and not after[end:tokens[i].start].strip():
        reading = _pick(analyses[i], ("adj", "pp"))
        if reading is None and tokens[i].text.lower() in CONJUNCTIONS and i + 1 < len(tokens) and \
                _pick(analyses[i + 1], ("adj", "pp")):
            end, i = tokens[i].end, i + 1
            continue
        if reading is None:
            break
        edits.append((tokens[i], reading))
        end, i = tokens[i].end, i + 1
    # "... es verde" / "... est petite": a copula in the third person, an optional adverb, then the adjective
    if i < len(tokens) and not re.search(r"[,;:.!?]", after[end:tokens[i].start]):
        verb = next((r for r in analyses[i] if ("<vbser>" in r or r.split("<")[0] in COPULAS) and "<p3>" in r), None)
        j = i + 1
        # an adverb before the adjective ("muy", "très", "molt": the last can be an adjective too): skipped when
        # an adjective follows it
        if verb and j + 1 < len(tokens) and any("adv>" in r for r in analyses[j]) and \
                _pick(analyses[j + 1], ("adj", "pp")):
            j += 1
        if verb and j < len(tokens):
            reading = _pick(analyses[j], ("adj", "pp"))
            if reading is not None:
                edits.append((tokens[j], reading))
    out, pos = [], 0
    for tok, reading in edits:
        new = _reinflect(reading, gender, number)
        form = morph.generate(_units(new)) if new else None
        if form:
            out.append(after[pos:tok.start] + _cased(form.strip(), tok.text))
            pos = tok.end
    return "".join(out) + after[pos:]
