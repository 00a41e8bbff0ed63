"""``linguafusion state migrate``'s core: copy one store's keys and glossaries into another, then check the copy.

What is copied is what the stores hold: a key's id, name, scopes, creation time, revocation and the digest that
authenticates it (never the key itself, which was never stored: every key keeps working because its digest
travels), and each glossary with its owner, id and terms (so ``glossary_id``s and a key's latest glossary stay
what they were). A record whose id the target holds already is left as it is: running the copy twice copies
nothing the second time. ``verify`` reads both stores back and lists every difference (empty: the copy is whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .users import UserStore


@dataclass
class Copied:
    keys: int = 0
    keys_there: int = 0  # held by the target already: left as they were
    glossaries: int = 0
    glossaries_there: int = 0
    vocabularies: int = 0
    problems: list[str] = field(default_factory=list)  # from ``verify``

    def to_dict(self) -> dict[str, object]:
        return {"keys": self.keys, "keys_already_there": self.keys_there, "glossaries": self.glossaries,
                "glossaries_already_there": self.glossaries_there, "vocabularies": self.vocabularies,
                "verified": not self.problems, "problems": self.problems}


def copy_users(src: UserStore, dst: UserStore) -> Copied:
    out = Copied()
    for record in src.records():
        if dst.import_key(record):
            out.keys += 1
        else:
            out.keys_there += 1
    for g in src.glossary_records():
        if dst.import_glossary(g):
            out.glossaries += 1
        else:
            out.glossaries_there += 1
    return out


def verify(src: UserStore, dst: UserStore) -> list[str]:
    """What of ``src`` the target does not hold as ``src`` holds it (a key's digest, scopes or revocation; a
    glossary's owner or terms)."""
    problems: list[str] = []
    there = {r.key.key_id: r for r in dst.records()}
    for r in src.records():
        got = there.get(r.key.key_id)
        if got is None or got.digest != r.digest or got.key.scopes != r.key.scopes:
            problems.append(f"key {r.key.key_id} is missing or differs")
        elif r.key.revoked and not got.key.revoked:
            problems.append(f"key {r.key.key_id} is revoked here but not there")
    glossaries = {g.glossary_id: g for g in dst.glossary_records()}
    for g in src.glossary_records():
        other = glossaries.get(g.glossary_id)
        if other is None or other.owner != g.owner or other.terms != g.terms:
            problems.append(f"glossary {g.glossary_id} is missing or differs")
    return problems
