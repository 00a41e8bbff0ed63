"""Segments through an MT route, on the engine: each segment is a work item of the pair's model key, batched with
other requests' and streams' items; the glossary's terms are protected across the whole route (a pivot included)
and the translation memory is used, both by the engine's MT runner (serving/threads.py), as for a stream."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..glossary import Term, protect
from ..models.registry import Registry
from ..models.routes import MTRoute
from ..models.transcript_guard import to_script
from ..serving.keys import ModelKey
from ..serving.ports import MtInput
from ..types import Segment
from ..untranslated import strip_marks
from .engine import EngineLink, FileCall
from .sentences import join, sentence_groups, spread


class SegmentMT:
    def __init__(self, registry: Registry, engine: Callable[[], EngineLink]) -> None:
        self.registry = registry
        self.engine = engine

    def translate(self, segs: list[Segment], route: MTRoute, terms: list[Term], models: dict[str, str],
                  call: FileCall, *, names: Sequence[Term] = (), sentences: bool = False,
                  unknown: list[str] | None = None, script: str | None = None) -> list[Term]:
        """Each segment's ``text`` becomes the translation of its ``source_text``; ``models`` notes the backends.
        Returns the glossary terms that were applied (``names``, kept as written, are not glossary terms).
        ``sentences`` (speech): segments that split a sentence are translated together and the translation is
        spread back over them (sentences.py). Words the engine left untranslated lose their marks and are added
        to ``unknown`` (lingua_fusion/untranslated.py). ``script``: Chinese output in "Hans" or "Hant"
        (models/transcript_guard.py; the engines write Simplified)."""
        if sentences and len(segs) > 1:
            return self._by_sentence(segs, route, terms, models, call, names, unknown, script)
        key = ModelKey.mt(route.legs[0].source, route.legs[-1].target)  # the runner takes the same route
        sources = [s.source_text for s in segs]
        items = [MtInput(text, tuple(terms), tuple(names), call.key_id) for text in sources]
        texts = self.engine().translate(key, items, call) if items else []
        for i, leg in enumerate(route.legs):  # named after the call: in process, as the engine loaded it
            models["mt" if len(route.legs) == 1 else f"mt_leg{i + 1}"] = self.registry.mt_name(leg.backend)
        if not segs:
            return []
        for s, t in zip(segs, texts, strict=True):
            s.text, words = strip_marks(t)
            if script:
                s.text = to_script(s.text, script)
            if unknown is not None:
                unknown += [w for w in words if w not in unknown]
        return applied_terms(sources, texts, terms)

    def _by_sentence(self, segs: list[Segment], route: MTRoute, terms: list[Term], models: dict[str, str],
                     call: FileCall, names: Sequence[Term], unknown: list[str] | None,
                     script: str | None) -> list[Term]:
        source, target = route.legs[0].source, route.legs[-1].target
        groups = sentence_groups(segs)
        whole = [Segment(start=segs[g[0]].start, end=segs[g[-1]].end, text="",
                         source_text=join([segs[i].source_text for i in g], source)) for g in groups]
        applied = self.translate(whole, route, terms, models, call, names=names, unknown=unknown, script=script)
        for g, sentence in zip(groups, whole, strict=True):
            pieces = spread(sentence.text, [len(segs[i].source_text.strip()) for i in g], target)
            for i, piece in zip(g, pieces, strict=True):
                segs[i].text = piece
        return applied

    def texts(self, rows: list[str], route: MTRoute, terms: list[Term], models: dict[str, str], call: FileCall,
              unknown: list[str] | None = None, script: str | None = None) -> list[str]:
        """Plain texts (a slide's rows, sign glosses) through ``translate``: their translations, in order."""
        segs = [Segment(start=0.0, end=0.0, source_text=r, text=r) for r in rows]
        self.translate(segs, route, terms, models, call, unknown=unknown, script=script)
        return [s.text for s in segs]


def applied_terms(sources: Sequence[str], outputs: Sequence[str], terms: Sequence[Term]) -> list[Term]:
    """The glossary terms a translation used: found in a source text, and their target in its translation (what
    the engine's protection puts there; glossary.apply_mt_batch)."""
    if not terms:
        return []
    seen: dict[str, Term] = {}
    for src, out in zip(sources, outputs, strict=True):
        for term in protect(src, terms)[1].values():
            if term.target.lower() in out.lower():
                seen.setdefault(term.source, term)
    return list(seen.values())
