"""Segments through an MT route: every leg of the route (a pivot included), the glossary's terms protected across
the whole route, the translation memory when it is on, the request's deadline checked between chunks."""

from __future__ import annotations

from ..deadline import Deadline
from ..glossary import Term, apply_mt
from ..models.registry import MTRoute, Registry
from ..models.transcript_guard import to_script
from ..types import Segment
from ..untranslated import strip_marks
from .sentences import join, sentence_groups, spread

MT_CHUNK = 32  # segments per MT call (a request's deadline is checked between calls)


class SegmentMT:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def translate(self, segs: list[Segment], route: MTRoute, terms: list[Term], models: dict[str, str],
                  deadline: Deadline | None = None, scope: str = "", *, sentences: bool = False,
                  unknown: list[str] | None = None, script: str | None = None) -> list[Term]:
        """Each segment's ``text`` becomes the translation of its ``source_text``; ``models`` notes the backends.
        Returns the glossary terms that were applied. ``scope``: whose translation memory (the API key's id).
        ``sentences`` (speech): segments that split a sentence are translated together and the translation is
        spread back over them (sentences.py). Words the engine left untranslated lose their marks and are added
        to ``unknown`` (lingua_fusion/untranslated.py). ``script``: Chinese output in "Hans" or "Hant"
        (models/transcript_guard.py; the engines write Simplified)."""
        if sentences and len(segs) > 1:
            return self._by_sentence(segs, route, terms, models, deadline, scope, unknown, script)
        legs = [(self.registry.mt(leg.backend), leg) for leg in route.legs]
        for i, (backend, _leg) in enumerate(legs):
            models["mt" if len(legs) == 1 else f"mt_leg{i + 1}"] = backend.info.name

        def run(texts: list[str]) -> list[str]:
            out: list[str] = []
            for i in range(0, len(texts), MT_CHUNK):  # in chunks, the deadline checked between them
                if deadline is not None:
                    deadline.check("mt")
                chunk = texts[i:i + MT_CHUNK]
                for backend, leg in legs:
                    chunk = backend.translate(chunk, leg.source, leg.target)
                out += chunk
            return out

        # the glossary maps source -> target terms, so placeholders span the whole route (pivot included)
        sources = [s.source_text for s in segs]
        tm = self.registry.translation_memory()  # the same slide for many users: MT once (lingua_fusion/tm)
        if tm is None:
            texts, applied = apply_mt(sources, terms, run, deadline=deadline)
        else:
            texts, per_text = tm.translate(self.registry.route_key(route), sources, [terms] * len(sources), run,
                                           deadline=deadline, scopes=[scope] * len(sources))
            applied = list({t.source: t for used in per_text for t in used}.values())
        for s, t in zip(segs, texts, strict=True):
            s.text, words = strip_marks(t)
            if script:
                s.text = to_script(s.text, script)
            if unknown is not None:
                unknown += [w for w in words if w not in unknown]
        return applied

    def _by_sentence(self, segs: list[Segment], route: MTRoute, terms: list[Term], models: dict[str, str],
                     deadline: Deadline | None, scope: str, unknown: list[str] | None,
                     script: str | None) -> list[Term]:
        source, target = route.legs[0].source, route.legs[-1].target
        groups = sentence_groups(segs)
        whole = [Segment(start=segs[g[0]].start, end=segs[g[-1]].end, text="",
                         source_text=join([segs[i].source_text for i in g], source)) for g in groups]
        applied = self.translate(whole, route, terms, models, deadline, scope, unknown=unknown, script=script)
        for g, sentence in zip(groups, whole, strict=True):
            pieces = spread(sentence.text, [len(segs[i].source_text.strip()) for i in g], target)
            for i, piece in zip(g, pieces, strict=True):
                segs[i].text = piece
        return applied

    def texts(self, rows: list[str], route: MTRoute, terms: list[Term], models: dict[str, str],
              deadline: Deadline | None = None, scope: str = "", unknown: list[str] | None = None,
              script: str | None = None) -> list[str]:
        """Plain texts (a slide's rows, sign glosses) through ``translate``: their translations, in order."""
        segs = [Segment(start=0.0, end=0.0, source_text=r, text=r) for r in rows]
        self.translate(segs, route, terms, models, deadline, scope, unknown=unknown, script=script)
        return [s.text for s in segs]
