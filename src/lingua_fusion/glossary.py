"""Glossaries: source term -> target term lists, applied to ASR (hot words) and MT (protected placeholders).

MT protection: each source term found in a segment is replaced by a placeholder the MT engines pass through
untouched, and the placeholder is replaced by the target term after translation. If an engine mangles a
placeholder, the segment is translated again with the target term substituted into the source, so the term still
comes out as the glossary says.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import InvalidParameter, TooLarge


@dataclass(frozen=True)
class Term:
    source: str
    target: str


def parse(data: bytes, *, max_terms: int, filename: str = "") -> list[Term]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidParameter("glossary must be UTF-8 CSV or JSON") from exc
    terms: list[Term] = []
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")) or filename.endswith(".json"):
        try:
            obj = json.loads(text)
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
        terms.append(Term(s.strip(), t.strip()))
    if not terms:
        raise InvalidParameter("glossary holds no terms")
    if len(terms) > max_terms:
        raise TooLarge(f"glossary has {len(terms)} terms; the limit is {max_terms}")
    return terms


def hotwords(terms: list[Term], limit: int = 40) -> str:
    return ", ".join(t.source for t in terms[:limit])


def _pattern(term: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + re.escape(term) + r"(?!\w)", re.IGNORECASE)


PLACEHOLDER = "[{}]"  # Apertium, Bergamot and the user models all pass bracketed numbers through


def protect(text: str, terms: list[Term]) -> tuple[str, dict[str, Term]]:
    found: dict[str, Term] = {}
    for term in sorted(terms, key=lambda t: -len(t.source)):
        pat = _pattern(term.source)
        if pat.search(text):
            key = PLACEHOLDER.format(900 + len(found))
            text = pat.sub(key, text)
            found[key] = term
    return text, found


def apply_mt(texts: list[str], terms: list[Term], translate: Callable[[list[str]], list[str]]
             ) -> tuple[list[str], list[Term]]:
    """Translate ``texts`` with ``translate`` while forcing glossary terms. Returns (translations, terms applied)."""
    outs, applied = apply_mt_batch(texts, [terms] * len(texts), translate)
    seen: dict[str, Term] = {}
    for used in applied:
        for t in used:
            seen.setdefault(t.source, t)
    return outs, list(seen.values())


def apply_mt_batch(texts: list[str], terms: list[list[Term]], translate: Callable[[list[str]], list[str]]
                   ) -> tuple[list[str], list[list[Term]]]:
    """Like ``apply_mt`` but each text has its own term list (one batch across streams, one MT call)."""
    if not any(terms):
        return translate(texts), [[] for _ in texts]
    protected = [protect(t, ts) for t, ts in zip(texts, terms, strict=True)]
    out = translate([p[0] for p in protected])
    applied: list[list[Term]] = [[] for _ in texts]
    retry: list[int] = []
    for i, (_src, mapping) in enumerate(protected):
        result = out[i]
        if all(k in result for k in mapping):
            for k, term in mapping.items():
                result = result.replace(k, term.target)
                applied[i].append(term)
            out[i] = result
        else:
            retry.append(i)
    if retry:
        subst = []
        for i in retry:
            s = texts[i]
            for term in protected[i][1].values():
                s = _pattern(term.source).sub(term.target, s)
            subst.append(s)
        for i, r in zip(retry, translate(subst), strict=True):
            out[i] = r
            applied[i] = [t for t in protected[i][1].values() if t.target.lower() in r.lower()]
    return out, applied
