"""The taught recogniser on synthetic landmark sequences: signs with noise, speed changes and mirrored hands are
recognised, signs never taught are "unknown"; normalisation and DTW pinned on exact cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lingua_fusion.errors import InvalidParameter
from lingua_fusion.vision import synthetic as syn
from lingua_fusion.vision.dtw import dtw, dtw_many
from lingua_fusion.vision.landmarks import LandmarkSeq
from lingua_fusion.vision.normalise import features
from lingua_fusion.vision.recogniser import UNKNOWN, Recogniser

VOCAB = syn.sign_vocabulary(12, seed=3)


@pytest.fixture(scope="module")
def signs() -> Recogniser:
    rng = np.random.default_rng(11)
    taught = [(s.gloss, syn.perform_sign(s, syn.random_performance(rng, mirrored=False), rng))
              for s in VOCAB for _ in range(3)]
    return Recogniser.teach("sign", taught)


def test_taught_signs_are_recognised_despite_noise_speed_and_position(signs: Recogniser) -> None:
    rng = np.random.default_rng(12)
    right = [signs.recognise(syn.perform_sign(s, syn.random_performance(rng, mirrored=False), rng)).gloss == s.gloss
             for s in VOCAB for _ in range(3)]
    assert sum(right) >= 0.9 * len(right)


def test_a_left_handed_signer_matches_right_handed_examples(signs: Recogniser) -> None:
    rng = np.random.default_rng(13)
    answers = [signs.recognise(syn.perform_sign(s, syn.random_performance(rng, mirrored=True), rng))
               for s in VOCAB for _ in range(2)]
    expected = [s.gloss for s in VOCAB for _ in range(2)]
    assert sum(a.gloss == e for a, e in zip(answers, expected, strict=True)) >= 0.9 * len(expected)


def test_fast_slow_and_uneven_performances_are_recognised(signs: Recogniser) -> None:
    rng = np.random.default_rng(14)
    for s in VOCAB[:6]:
        for duration, warp in ((0.5, 1.0), (2.2, 1.0), (1.0, 0.65), (1.0, 1.5)):
            perf = syn.Performance(duration=duration, warp=warp, noise=0.002)
            assert signs.recognise(syn.perform_sign(s, perf, rng)).gloss == s.gloss, (s.gloss, duration, warp)


def test_signs_never_taught_are_unknown(signs: Recogniser) -> None:
    rng = np.random.default_rng(15)
    others = syn.sign_vocabulary(20, seed=99)
    answers = [signs.recognise(syn.perform_sign(s, syn.random_performance(rng), rng)) for s in others]
    assert sum(a.gloss == UNKNOWN for a in answers) >= 16
    assert all(a.nearest for a in answers)  # the nearest gloss is still reported


def test_confidence_is_high_for_a_clear_match_and_low_between_two_glosses() -> None:
    rng = np.random.default_rng(16)
    a, b = VOCAB[0], VOCAB[1]
    rec = Recogniser.teach("sign", [(a.gloss, syn.perform_sign(a, syn.Performance(noise=0.0), rng)),
                                    (b.gloss, syn.perform_sign(b, syn.Performance(noise=0.0), rng))])
    clear = rec.recognise(syn.perform_sign(a, syn.Performance(noise=0.002), rng))
    assert clear.gloss == a.gloss and clear.confidence > 0.5
    # a query taught under both names is exactly between them: confidence 0, answer unknown
    same = Recogniser.teach("sign", [("X", syn.perform_sign(a, syn.Performance(noise=0.0), rng)),
                                     ("Y", syn.perform_sign(a, syn.Performance(noise=0.0), rng))])
    tie = same.recognise(syn.perform_sign(a, syn.Performance(noise=0.0), rng))
    assert tie.confidence == 0.0 and tie.gloss == UNKNOWN


def test_lip_words_are_recognised_and_unknown_words_rejected() -> None:
    rng = np.random.default_rng(17)
    lv = syn.lip_vocabulary(["yes", "no", "hello", "stop", "water", "help"], seed=2)
    rec = Recogniser.teach("lip", [(w.gloss, syn.perform_lips(w, syn.random_performance(rng), rng))
                                   for w in lv for _ in range(3)])
    right = [rec.recognise(syn.perform_lips(w, syn.random_performance(rng), rng)).gloss == w.gloss
             for w in lv for _ in range(4)]
    assert sum(right) >= 0.85 * len(right)


def test_features_ignore_position_size_and_which_hand_signs() -> None:
    rng = np.random.default_rng(0)
    spec = VOCAB[2]
    base = features(syn.perform_sign(spec, syn.Performance(noise=0.0), rng), "sign")
    moved = features(syn.perform_sign(spec, syn.Performance(noise=0.0, scale=1.3, offset=(0.1, -0.05)), rng), "sign")
    mirrored = features(syn.perform_sign(spec, syn.Performance(noise=0.0, mirrored=True), rng), "sign")
    np.testing.assert_allclose(moved, base, atol=1e-4)
    np.testing.assert_allclose(mirrored, base, atol=1e-4)
    other = features(syn.perform_sign(VOCAB[3], syn.Performance(noise=0.0), rng), "sign")
    assert np.abs(other - base).max() > 0.1


def test_a_sequence_without_hands_is_refused_as_a_sign() -> None:
    rng = np.random.default_rng(0)
    lips_only = syn.perform_lips(syn.lip_vocabulary(["a"])[0], syn.Performance(), rng)
    with pytest.raises(InvalidParameter):
        features(lips_only, "sign")
    with pytest.raises(InvalidParameter):
        features(lips_only, "gesture")


def test_dtw_absorbs_a_time_stretch_that_lockstep_comparison_does_not() -> None:
    t = np.linspace(0, 1, 40)
    a = np.stack([np.sin(2 * np.pi * t), np.cos(3 * np.pi * t)], axis=1)
    u = t ** 1.6  # the same movement, slow start and fast end
    b = np.stack([np.sin(2 * np.pi * u), np.cos(3 * np.pi * u)], axis=1)
    lockstep = float(np.linalg.norm(a - b, axis=1).sum() / 80)
    assert dtw(a, a) == 0.0
    assert dtw(a, b, radius=10) < lockstep / 3
    assert dtw(a, b, radius=0) == pytest.approx(lockstep)  # a zero band is lock-step comparison
    many = dtw_many(a, np.stack([a, b, b[::-1]]), radius=10)
    assert many[0] == 0.0 and many[1] == pytest.approx(dtw(a, b, radius=10)) and many[2] > many[1]


def test_landmark_json_round_trip_and_bad_frames_refused() -> None:
    rng = np.random.default_rng(0)
    seq = syn.perform_sign(VOCAB[0], syn.Performance(mirrored=True, drop=0.2), rng)
    back = LandmarkSeq.from_json(seq.to_json())
    np.testing.assert_array_equal(back.hand_mask, seq.hand_mask)
    np.testing.assert_allclose(back.hands, seq.hands, atol=1e-5)
    bad = seq.to_json()
    bad[3]["right_hand"] = bad[3]["right_hand"][:20] if bad[3]["right_hand"] else [[0, 0]] * 20
    with pytest.raises(InvalidParameter, match=r"frames\[3\]"):
        LandmarkSeq.from_json(bad)
    with pytest.raises(InvalidParameter):
        LandmarkSeq.from_json([{"t": float("nan")}])
    with pytest.raises(InvalidParameter):
        LandmarkSeq.from_json([{"t": 1.0}, {"t": 0.5}])


def test_a_hand_whose_left_right_label_flips_is_still_one_hand() -> None:
    rng = np.random.default_rng(5)
    spec = next(s for s in VOCAB if not s.two_handed)
    clean = syn.perform_sign(spec, syn.Performance(noise=0.0), rng)
    flips = rng.random(len(clean)) < 0.35  # the detector calls the right hand "left" in about a third of frames
    hands, mask = clean.hands.copy(), clean.hand_mask.copy()
    hands[flips] = hands[flips][:, ::-1]
    mask[flips] = mask[flips][:, ::-1]
    flipped = LandmarkSeq(clean.t, hands, mask, clean.pose, clean.pose_mask, clean.lips, clean.lips_mask)
    np.testing.assert_allclose(features(flipped, "sign"), features(clean, "sign"), atol=1e-4)


def _taught(n_per_gloss: int, glosses: int = 3, seed: int = 21) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(s.gloss, features(syn.perform_sign(s, syn.random_performance(rng, mirrored=False), rng), "sign"))
            for s in VOCAB[:glosses] for _ in range(n_per_gloss)]


def test_a_recogniser_grown_example_by_example_equals_one_built_at_once() -> None:
    """The store grows its cached recogniser by each taught example (issue 29: every change re-parsed every stored
    example); it must answer as one built from all of them."""
    from lingua_fusion.vision.recogniser import Example

    taught = [Example(g, f) for g, f in _taught(4)]
    whole = Recogniser("sign", taught)
    grown = Recogniser("sign", taught[:1])
    for e in taught[1:]:
        grown = grown.with_example(e)
    assert grown.radius == pytest.approx(whole.radius) and whole.radius != Recogniser("sign", taught[:1]).radius
    query = _taught(1, seed=99)
    for _gloss, f in query:
        assert grown.recognise_features(f) == whole.recognise_features(f)
    assert len(grown.examples) == len(taught) and len(Recogniser("sign", taught[:1]).examples) == 1  # not mutated


def test_calibration_compares_an_example_with_at_most_16_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """500 examples of one gloss: calibration compared every example with every other (13-18 s of CPU per change);
    now at most CALIBRATION_PEERS each, and up to 17 examples of a gloss every pair is still compared."""
    from lingua_fusion.vision import recogniser as rec_module
    from lingua_fusion.vision.recogniser import CALIBRATION_PEERS, Example

    compared: list[int] = []
    real = rec_module.dtw_many

    def counting(query: np.ndarray, templates: np.ndarray, radius: int | None = None) -> np.ndarray:
        compared.append(len(templates))
        return real(query, templates, radius)

    monkeypatch.setattr(rec_module, "dtw_many", counting)
    many = [Example(g, f) for g, f in _taught(60, glosses=1)]
    Recogniser("sign", many)
    assert max(compared) == CALIBRATION_PEERS and sum(compared) <= CALIBRATION_PEERS * len(many)
    compared.clear()
    few = [Example(g, f) for g, f in _taught(17, glosses=1)]
    Recogniser("sign", few)
    assert sum(compared) == 17 * 16 // 2  # every pair once


def test_the_store_grows_its_recogniser_without_parsing_any_stored_example(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lingua_fusion.vision import bigjson
    from lingua_fusion.vision.store import VocabularyStore

    rng = np.random.default_rng(5)
    seqs = [(s.gloss, syn.perform_sign(s, syn.random_performance(rng, mirrored=False), rng))
            for s in VOCAB[:3] for _ in range(3)]
    store = VocabularyStore(tmp_path)
    vid = store.create("key-a", "signs", "sign").vocab_id
    for gloss, seq in seqs[:-1]:
        store.add_example("key-a", vid, gloss, seq)
    first = store.recogniser("key-a", vid)

    parsed: list[int] = []
    real = bigjson.loads

    def counting(raw: bytes) -> object:
        parsed.append(len(raw))
        return real(raw)

    monkeypatch.setattr(bigjson, "loads", counting)
    store.add_example("key-a", vid, *seqs[-1])
    grown = store.recogniser("key-a", vid)
    assert len(grown.examples) == len(first.examples) + 1
    assert len(parsed) == 1  # the new example's own JSON, once; none of the stored ones
    store._cache.clear()  # a rebuild (after a restart, a delete) reads the stored features, not the JSON
    rebuilt = store.recogniser("key-a", vid)
    assert rebuilt.radius == pytest.approx(grown.radius) and len(parsed) == 1
    store.close()


def test_a_store_from_before_features_were_kept_still_recognises(tmp_path: Path) -> None:
    import sqlite3

    from lingua_fusion.vision.store import VocabularyStore

    rng = np.random.default_rng(6)
    seqs = [(s.gloss, syn.perform_sign(s, syn.random_performance(rng, mirrored=False), rng))
            for s in VOCAB[:2] for _ in range(2)]
    store = VocabularyStore(tmp_path)
    vid = store.create("key-a", "signs", "sign").vocab_id
    for gloss, seq in seqs:
        store.add_example("key-a", vid, gloss, seq)
    expected = store.recogniser("key-a", vid).recognise(seqs[0][1])
    path = store.path
    store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE vocab_examples SET features = NULL")  # as an older server left its rows
    db.commit()
    db.close()
    again = VocabularyStore(tmp_path)
    assert again.recogniser("key-a", vid).recognise(seqs[0][1]) == expected
    again.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM vocab_examples WHERE features IS NULL").fetchone()[0] == 0
    db.close()



def test_a_worker_that_loses_the_race_to_add_a_column_still_starts(tmp_path: Path) -> None:
    # serve --workers opens the file from every worker at the same moment: each may find the features column
    # missing, and the one that lost the race to add it died at start-up ("duplicate column name: features").
    # Made certain here: another process has the column added but not committed when this store looks.
    import sqlite3
    import threading
    import time

    from lingua_fusion.vision.store import VocabularyStore

    path = VocabularyStore(tmp_path).path
    db = sqlite3.connect(path, isolation_level=None)  # as a release before features left the file
    db.execute("DROP TABLE vocab_examples")
    db.execute("CREATE TABLE vocab_examples (example_id TEXT PRIMARY KEY, vocab_id TEXT, gloss TEXT, frames TEXT, "
               "n_frames INTEGER, created REAL)")
    db.execute("CREATE INDEX vocab_examples_by_vocab ON vocab_examples (vocab_id)")
    db.execute("BEGIN IMMEDIATE")
    db.execute("ALTER TABLE vocab_examples ADD COLUMN features BLOB")
    opened: list[object] = []
    racer = threading.Thread(target=lambda: opened.append(_store_or_error(tmp_path)))
    racer.start()
    time.sleep(1.0)  # the store has read the old schema and waits for the write lock to add the column
    db.execute("COMMIT")
    racer.join(30)
    db.close()
    assert len(opened) == 1 and isinstance(opened[0], VocabularyStore), opened
    opened[0].close()


def _store_or_error(state_dir: Path) -> object:
    from lingua_fusion.vision.store import VocabularyStore

    try:
        return VocabularyStore(state_dir)
    except Exception as exc:  # what the test reports: the store that did not open
        return exc

