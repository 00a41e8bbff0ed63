"""Glossaries: source term -> target term lists, applied to ASR (hot words) and MT (protected placeholders).

MT protection: each source term found in a segment is replaced by a placeholder the MT engines pass through
untouched, and the placeholder is replaced by the target term after translation. If an engine mangles a
placeholder, the segment is translated again with the target term substituted into the source, so the term still
comes out as the glossary says. A glossary is compiled once into one pattern (``Matcher``): finding its terms in a
segment costs about the segment's length, whatever the number of terms.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import agreement, strict_json
from .deadline import Deadline
from .errors import InvalidParameter, TooLarge
from .json_bounds import JsonBounds


@dataclass(frozen=True)
class Term:
    source: str
    target: str


def parse(data: bytes, *, max_terms: int, filename: str = "", bounds: JsonBounds | None = None) -> list[Term]:
    """The terms of a CSV or JSON glossary (JSON past ``bounds`` is refused before it is parsed: TooLarge)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidParameter("glossary must be UTF-8 CSV or JSON") from exc
    terms: list[Term] = []
    pairs: list[tuple[object, object]]
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")) or filename.endswith(".json"):
        try:
            obj = strict_json.loads(text, bounds)  # a lone surrogate would reach SQLite and the model wire
        except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested thousands deep
            raise InvalidParameter(f"glossary JSON is invalid: {exc}") from exc
        if isinstance(obj, dict) and "terms" in obj:
            obj = obj["terms"]
        if isinstance(obj, dict):
            pairs = list(obj.items())
        elif isinstance(obj, list):
            pairs = []
            for item in obj:
                if isinstance(item, dict) and "source" in item and "target" in item:
                    pairs.append((item["source"], item["target"]))
                elif isinstance(item, list | tuple) and len(item) == 2:
                    pairs.append((item[0], item[1]))
                else:
                    raise InvalidParameter("glossary JSON items must be {source, target} or [source, target]")
        else:
            raise InvalidParameter("glossary JSON must be an object or a list")
    else:
        try:
            rows = list(csv.reader(io.StringIO(text, newline="")))
        except csv.Error as exc:  # a field over csv's size limit, a stray NUL or carriage return
            raise InvalidParameter(f"glossary CSV is malformed: {exc}") from exc
        if rows and [c.strip().lower() for c in rows[0][:2]] == ["source", "target"]:
            rows = rows[1:]
        pairs = []
        for i, row in enumerate(rows):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 2:
                raise InvalidParameter(f"glossary CSV line {i + 1} needs two columns: source,target")
            pairs.append((row[0], row[1]))
    for s, t in pairs:
        if not isinstance(s, str) or not isinstance(t, str) or not s.strip() or not t.strip():
            raise InvalidParameter("glossary terms must be non-empty strings")
        if len(s.strip()) > MAX_TERM_CHARS or len(t.strip()) > 10 * MAX_TERM_CHARS:
            raise InvalidParameter(f"glossary source terms are at most {MAX_TERM_CHARS} characters "
                                   f"(targets {10 * MAX_TERM_CHARS})")
        terms.append(Term(s.strip(), t.strip()))
    if not terms:
        raise InvalidParameter("glossary holds no terms")
    if len(terms) > max_terms:
        raise TooLarge(f"glossary has {len(terms)} terms; the limit is {max_terms}")
    return terms


def hotwords(terms: list[Term], limit: int = 40) -> str:
    return ", ".join(t.source for t in terms[:limit])


PLACEHOLDER = "[{}]"  # Apertium, Bergamot and the user models all pass bracketed numbers through
MAX_TERM_CHARS = 100  # a longer source term is refused at parse time (it would only deepen the pattern)
_MATCHERS_CACHED = 16  # a 5,000-term matcher holds about 1 MB


class Matcher:
    """Every source term of a glossary in one compiled pattern: one scan of a text finds all the terms it holds,
    case-insensitively, on word boundaries, the longest term first where several start at the same place.

    The pattern is a trie of the terms (``(?:bank(?:s)?|credit card)``), so a scan costs about the text's length,
    not the text's length times the number of terms; it is compiled once per glossary (``matcher``, cached).
    """

    def __init__(self, terms: tuple[Term, ...]) -> None:
        self.terms: dict[str, Term] = {}
        for t in terms:  # the first spelling of a term wins, as the first listed term always did
            self.terms.setdefault(_fold(t.source), t)
        self.pattern = _compile(list(self.terms)) if self.terms else None

    def find(self, text: str) -> list[tuple[re.Match[str], Term]]:
        if self.pattern is None:
            return []
        return [(m, self._term(m.group(0))) for m in self.pattern.finditer(text)]

    def sub(self, text: str, replace: Callable[[Term], str]) -> str:
        if self.pattern is None:
            return text
        return self.pattern.sub(lambda m: replace(self._term(m.group(0))), text)

    def _term(self, matched: str) -> Term:
        term = self.terms.get(_fold(matched))
        if term is None:  # case folding that changes a character's length (rare): compare term by term
            term = next(t for t in self.terms.values() if re.fullmatch(re.escape(t.source), matched, re.IGNORECASE))
        return term


def _fold(s: str) -> str:
    return "".join(c.lower() if len(c.lower()) == 1 else c for c in s)


def _compile(keys: list[str]) -> re.Pattern[str]:
    body: str
    try:
        body = _trie_regex(keys)
        return re.compile(r"(?<!\w)(?:" + body + r")(?!\w)", re.IGNORECASE)
    except (RecursionError, re.error, OverflowError):  # a trie too deep for the regex compiler: a flat alternation
        body = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
        return re.compile(r"(?<!\w)(?:" + body + r")(?!\w)", re.IGNORECASE)


def _trie_regex(keys: list[str]) -> str:
    """A regex matching exactly ``keys``, built on their prefix tree; longer continuations are tried first, so at
    each position the longest term wins (and a shorter one where the longer fails the word boundary)."""
    root: dict[str, dict] = {}  # type: ignore[type-arg]
    end = ""  # the key "" marks a term ending at a node
    for k in keys:
        node = root
        for ch in k:
            node = node.setdefault(ch, {})
        node[end] = {}

    def emit(node: dict) -> str:  # type: ignore[type-arg]
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch != end]
        if not branches:
            return ""
        alt = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if end in node:
            return ("(?:" + alt + ")?") if len(branches) == 1 else alt + "?"
        return alt

    return emit(root)


@functools.lru_cache(maxsize=_MATCHERS_CACHED)
def _matcher(terms: tuple[Term, ...]) -> Matcher:
    return Matcher(terms)


SMALL = 32  # term sets this small compile in well under a millisecond: not worth a cache slot


def matcher(terms: Sequence[Term]) -> Matcher:
    """The compiled matcher of ``terms`` (one per distinct glossary, kept for the next call)."""
    return Matcher(tuple(terms)) if len(terms) <= SMALL else _matcher(tuple(terms))


def protect(text: str, terms: Sequence[Term], names: Sequence[Term] = ()) -> tuple[str, dict[str, Term]]:
    """Replace each glossary term in ``text`` by a placeholder (one per distinct term, numbered in order of
    appearance), then each of ``names`` (a second, small set, matched in what the glossary left). Returns the
    protected text and placeholder -> term."""
    found: dict[str, Term] = {}
    keys: dict[Term, str] = {}

    def placeholder(term: Term) -> str:
        if term not in keys:
            keys[term] = PLACEHOLDER.format(900 + len(found))
            found[keys[term]] = term
        return keys[term]

    text = matcher(terms).sub(text, placeholder)
    if names:
        text = matcher(names).sub(text, placeholder)
    return text, found


def apply_mt(texts: list[str], terms: list[Term], translate: Callable[[list[str]], list[str]], *,
             deadline: Deadline | None = None) -> tuple[list[str], list[Term]]:
    """Translate ``texts`` with ``translate`` while forcing glossary terms. Returns (translations, terms applied).
    ``deadline`` is checked between texts (a request past its time stops here, not after the work)."""
    outs, applied = apply_mt_batch(texts, [terms] * len(texts), translate, deadline=deadline)
    seen: dict[str, Term] = {}
    for used in applied:
        for t in used:
            seen.setdefault(t.source, t)
    return outs, list(seen.values())


def apply_mt_batch(texts: list[str], terms: list[Sequence[Term]], translate: Callable[[list[str]], list[str]], *,
                   names: list[Sequence[Term]] | None = None, deadline: Deadline | None = None
                   ) -> tuple[list[str], list[list[Term]]]:
    """Like ``apply_mt`` but each text has its own term list (one batch across streams, one MT call), and
    optionally its own ``names`` (protect's second set)."""
    extra: list[Sequence[Term]] = names if names is not None else [() for _ in texts]
    if not any(terms) and not any(extra):
        return translate(texts), [[] for _ in texts]
    protected = []
    for t, ts, ns in zip(texts, terms, extra, strict=True):
        if deadline is not None:
            deadline.check("glossary")
        protected.append(protect(t, ts, ns))
    out = translate([p[0] for p in protected])
    applied: list[list[Term]] = [[] for _ in texts]
    retry: list[int] = []
    for i, (_src, mapping) in enumerate(protected):
        result = out[i]
        if all(k in result for k in mapping):
            for k, term in mapping.items():
                result = agreement.agree(result, k, term.target)  # articles/adjectives agree (es ca fr pt)
                applied[i].append(term)
            out[i] = result
        else:
            retry.append(i)
    if retry:
        if deadline is not None:
            deadline.check("glossary")
        subst = []
        for i in retry:
            found = list(protected[i][1].values())
            subst.append(matcher(found).sub(texts[i], lambda term: term.target))
        for i, r in zip(retry, translate(subst), strict=True):
            out[i] = r
            applied[i] = [t for t in protected[i][1].values() if t.target.lower() in r.lower()]
    return out, applied
