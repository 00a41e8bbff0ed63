"""Copy every owner's vocabularies from one store to another (``linguafusion state migrate --to redis URL``: the
state directory's SQLite vocabularies onto a Redis that servers will share).

Ids, owners, names, kinds, languages and the times vocabularies and examples were made are kept, and each
example's stored landmark JSON and features are copied as they are (nothing is computed again). It can be run
again: what the destination holds already is left alone (an example added at the source since the last run is
copied; one deleted there is not deleted here). Limits are not checked at the destination: the source kept them.
A vocabulary deleted at the source while it is copied is left out (or left as far as it was copied).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import NotFound
from .vocab_port import VocabularyBackend


def copy_vocabularies(src: VocabularyBackend, dst: VocabularyBackend, *, owners: Iterable[str] | None = None) -> int:
    """Copy ``src``'s vocabularies (of every owner, or of ``owners``), with their examples, into ``dst``; how many
    vocabularies this call wrote (made, or given examples they lacked): 0 when ``dst`` held everything already."""
    copied = 0
    for owner in src.owners() if owners is None else owners:
        for vocab in src.list(owner):
            try:
                if dst.restore(owner, vocab, src.stored_examples(owner, vocab.vocab_id)):
                    copied += 1
            except NotFound:  # the source's own: deleted there since it was listed
                continue
    return copied
