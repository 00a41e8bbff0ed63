"""vision/bigjson: the JSON of landmark bodies, read and written so that a worker thread doing it lets the event
loop run. Strict as strict_json; what LandmarkSeq.from_json accepts and refuses is unchanged; a body's point arrays
do not stay as hundreds of thousands of lists (which the cyclic GC walked, holding the GIL)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest

from lingua_fusion.errors import InvalidParameter
from lingua_fusion.vision import bigjson
from lingua_fusion.vision import synthetic as syn
from lingua_fusion.vision.landmarks import LandmarkSeq
from lingua_fusion.vision.store import VocabularyStore


def _frames(n: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    return [{"t": i / 30, "left_hand": rng.random((21, 2)).round(5).tolist(), "right_hand": None,
             "pose": rng.random((33, 2)).round(5).tolist()} for i in range(n)]


@pytest.mark.parametrize("raw", [b'{"a": NaN}', b'[Infinity]', b'["\\ud800"]', b'{"a": ["x", "\\udfff"]}',
                                 b'{nope', b'\xff\xfe'])
def test_what_is_not_strict_json_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        bigjson.loads(raw)


def test_a_surrogate_pair_and_every_json_value_pass() -> None:
    doc = {"gloss": "hi 😀", "n": [1, 2.5, True, None], "nested": {"pose": [[1, 2], [3, 4]]}, "s": ["a", "b"],
           "kind": [[1, 2]]}
    got = bigjson.loads(json.dumps(doc).encode())
    assert got["gloss"] == "hi 😀" and got["n"] == [1, 2.5, True, None] and got["s"] == ["a", "b"]
    assert np.array_equal(got["nested"]["pose"], [[1, 2], [3, 4]])
    assert got["kind"] == [[1, 2]]  # only a frame's point arrays become numpy arrays
    assert bigjson.loads(b'["\\ud83d\\ude00"]') == ["😀"]
    assert json.loads(bigjson.dumps(got)) == doc  # arrays are written back as lists


def test_a_sequence_reads_the_same_and_bad_parts_are_refused_as_before() -> None:
    rng = np.random.default_rng(2)
    seq = syn.perform_sign(syn.sign_vocabulary(1, seed=3)[0], syn.random_performance(rng), rng)
    raw = json.dumps({"frames": seq.to_json()}).encode()
    mine, plain = LandmarkSeq.from_json(bigjson.loads(raw)["frames"]), LandmarkSeq.from_json(json.loads(raw)["frames"])
    assert np.array_equal(mine.hands, plain.hands) and np.array_equal(mine.hand_mask, plain.hand_mask)
    assert mine.to_json() == plain.to_json()
    for bad, where in ((b'[[1, 2], [3]]', "left_hand"), (b'[[1, "x"]]', "left_hand"), (b'[[1, 2, 3]]', "left_hand"),
                       (b'[[1e300, 2]]', "left_hand")):
        frames = bigjson.loads(b'{"frames": [{"t": 0, "left_hand": ' + bad + b'}]}')["frames"]
        with pytest.raises(InvalidParameter, match=where):
            LandmarkSeq.from_json(frames)


def test_a_large_body_does_not_stay_as_a_list_per_point() -> None:
    raw = json.dumps({"frames": _frames(2000)}).encode()
    gc.collect()
    before = len(gc.get_objects())
    doc = bigjson.loads(raw)
    held = len(gc.get_objects()) - before
    assert held < 10_000, held  # json.loads holds about 110,000 lists here (one per point)
    assert isinstance(doc["frames"][0]["pose"], np.ndarray) and doc["frames"][0]["pose"].shape == (33, 2)


def test_the_export_is_the_taught_sequences(tmp_path: Path) -> None:
    store = VocabularyStore(tmp_path)
    vocab = store.create("k", "signs", "sign")
    rng = np.random.default_rng(5)
    seqs = [syn.perform_sign(s, syn.random_performance(rng), rng) for s in syn.sign_vocabulary(2, seed=1)]
    for i, s in enumerate(seqs):
        store.add_example("k", vocab.vocab_id, f"g{i}", s)
    doc = json.loads(store.export_json("k", vocab.vocab_id))
    assert doc == {"format": "linguafusion-vocabulary/1", "name": "signs", "kind": "sign", "lang": "en",
                   "examples": [{"gloss": f"g{i}", "frames": s.to_json()} for i, s in enumerate(seqs)]}
    assert store.stored_bytes("k") == sum(len(json.dumps(e["frames"], separators=(",", ":"))) for e in doc["examples"])
    store.close()


def test_the_local_export_document_is_plain_json(tmp_path: Path) -> None:
    store = VocabularyStore(tmp_path)
    vocab = store.create("k", "signs", "sign")
    rng = np.random.default_rng(5)
    store.add_example("k", vocab.vocab_id, "g", syn.perform_sign(syn.sign_vocabulary(1, seed=1)[0],
                                                                syn.random_performance(rng), rng))
    doc = store.export("k", vocab.vocab_id)
    assert json.loads(json.dumps(doc)) == json.loads(store.export_json("k", vocab.vocab_id))
    store.close()


def test_an_import_by_a_key_with_no_room_is_refused_before_its_examples_are_checked(tmp_path: Path) -> None:
    """At its cap of vocabularies a key's import is refused as quota_exceeded before any example is read: an
    attack's flood of imports at the cap had each one parsed and checked (in a file slot) only to be refused."""
    from lingua_fusion.errors import QuotaExceeded

    store = VocabularyStore(tmp_path, max_per_key=1)
    store.create("k", "signs", "sign")
    bad = {"format": "linguafusion-vocabulary/1", "kind": "sign", "examples": [{"gloss": "", "frames": "x"}]}
    with pytest.raises(QuotaExceeded, match="the most it may keep"):
        store.import_("k", bad)
    store.close()
