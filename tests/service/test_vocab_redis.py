"""Vocabularies on Redis (vision/redis_store.py): two servers with their own state directories and one Redis are one
service; the limits hold when both write at once; another key's vocabulary is not found; a recogniser follows a
change made on the other server; SQLite's vocabularies copy across unchanged, twice over; a Redis that is down is a
503. Real redis-server (the one `make test` starts, and one of this file's own that it stops)."""

from __future__ import annotations

import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import REDIS, needs_redis

from lingua_fusion.config import Settings, StateSettings, VisionSettings
from lingua_fusion.errors import LinguaFusionError, NotFound, QuotaExceeded, StoreUnavailable
from lingua_fusion.lab.chaos.redis_server import ManagedRedis
from lingua_fusion.vision import synthetic as syn
from lingua_fusion.vision.landmarks import LandmarkSeq
from lingua_fusion.vision.redis_store import RedisVocabularyStore
from lingua_fusion.vision.store import VocabularyStore
from lingua_fusion.vision.vocab_copy import copy_vocabularies
from lingua_fusion.vision.vocab_model import Vocabulary
from lingua_fusion.vision.vocab_port import VocabularyBackend, open_vocabularies

SIGNS = syn.sign_vocabulary(4, seed=3)
RNG = np.random.default_rng(7)
TAUGHT = [(s.gloss, syn.perform_sign(s, syn.random_performance(RNG, mirrored=False), RNG)) for s in SIGNS
          for _ in range(2)]
LIPS = [(w.gloss, syn.perform_lips(w, syn.Performance(), RNG)) for w in syn.lip_vocabulary(["yes", "no"], seed=2)]


def _owner() -> str:
    """A key id of this test alone: tests running at once on the one Redis never see each other's vocabularies."""
    return "key_" + secrets.token_hex(6)


def _settings(state_dir: Path, redis_url: str | None, **vision: int) -> Settings:
    return Settings(state=StateSettings(state_dir=state_dir, redis_url=redis_url), vision=VisionSettings(**vision))


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., tuple[VocabularyBackend, VocabularyBackend]]]:
    """Two servers' stores (own state directories, one Redis), with the limits asked; what the test's owners made
    is deleted afterwards."""
    made: list[VocabularyBackend] = []
    owners: list[str] = []

    def make(*of: str, **limits: int) -> tuple[VocabularyBackend, VocabularyBackend]:
        owners.extend(of)
        a = open_vocabularies(_settings(tmp_path / "a", REDIS, **limits))
        b = open_vocabularies(_settings(tmp_path / "b", REDIS, **limits))
        made.extend([a, b])
        return a, b

    yield make
    if made:
        for owner in owners:
            for vocab in made[0].list(owner):
                made[0].delete(owner, vocab.vocab_id)
    for store in made:
        store.close()


def _teach(store: VocabularyBackend, owner: str, examples: list[tuple[str, LandmarkSeq]], kind: str = "sign") -> str:
    vid = store.create(owner, f"{kind}s", kind).vocab_id
    for gloss, seq in examples:
        store.add_example(owner, vid, gloss, seq)
    return vid


def test_the_selector_keeps_sqlite_without_a_redis_url(tmp_path: Path) -> None:
    store = open_vocabularies(_settings(tmp_path, None))
    assert isinstance(store, VocabularyStore) and (tmp_path / "vocabularies.sqlite3").exists()
    store.close()
    store = open_vocabularies(_settings(tmp_path, "redis://127.0.0.1:1/0", max_vocabularies_per_key=3))
    assert isinstance(store, RedisVocabularyStore) and store.max_per_key == 3  # nothing sent yet
    store.close()


@needs_redis
def test_two_servers_sharing_a_redis_see_each_others_vocabularies_and_examples(servers: Callable[..., tuple[
        VocabularyBackend, VocabularyBackend]]) -> None:
    owner = _owner()
    a, b = servers(owner)
    vid = _teach(a, owner, TAUGHT[:4])
    assert [v.to_dict() for v in b.list(owner)] == [v.to_dict() for v in a.list(owner)]
    assert b.get(owner, vid) == a.get(owner, vid) and b.get(owner, vid).examples == 4
    assert b.get(owner, vid).glosses == 2
    assert b.examples(owner, vid) == a.examples(owner, vid)
    assert [e["gloss"] for e in b.examples(owner, vid)] == [g for g, _s in TAUGHT[:4]]  # in the order taught
    assert b.export_json(owner, vid) == a.export_json(owner, vid)
    assert b.export(owner, vid)["examples"][0]["frames"] == TAUGHT[0][1].to_json()
    assert b.stored_bytes(owner) == a.stored_bytes(owner) > 0
    gloss, seq = TAUGHT[2]
    assert b.recogniser(owner, vid).recognise(seq).gloss == gloss

    first = b.examples(owner, vid)[0]["example_id"]
    b.delete_example(owner, vid, first)  # a change on B is A's too
    assert [e["example_id"] for e in a.examples(owner, vid)] == [e["example_id"] for e in b.examples(owner, vid)]
    assert a.get(owner, vid).examples == 3
    copy = b.import_(owner, a.export(owner, vid), name="copy")
    assert a.get(owner, copy.vocab_id).examples == 3 and a.get(owner, copy.vocab_id).name == "copy"
    a.delete(owner, vid)
    with pytest.raises(NotFound):
        b.get(owner, vid)
    assert [v.vocab_id for v in b.list(owner)] == [copy.vocab_id]


@needs_redis
def test_another_key_gets_not_found_everywhere(servers: Callable[..., tuple[VocabularyBackend,
                                                                             VocabularyBackend]]) -> None:
    owner, other = _owner(), _owner()
    a, b = servers(owner, other)
    vid = _teach(a, owner, TAUGHT[:2])
    eid = a.examples(owner, vid)[0]["example_id"]
    assert b.list(other) == []
    calls: list[Callable[[], object]] = [
        lambda: b.get(other, vid), lambda: b.examples(other, vid), lambda: b.export_json(other, vid),
        lambda: b.recogniser(other, vid), lambda: b.add_example(other, vid, *TAUGHT[0]),
        lambda: b.delete_example(other, vid, eid), lambda: b.delete(other, vid),
        lambda: list(b.stored_examples(other, vid))]
    for call in calls:
        with pytest.raises(NotFound) as caught:
            call()
        assert caught.value.code == "not_found" and caught.value.details == {"vocabulary_id": vid}
    assert a.get(owner, vid).examples == 2 and b.stored_bytes(other) == 0  # nothing of it changed


@needs_redis
def test_glosses_in_any_script_are_counted_and_uncounted(servers: Callable[..., tuple[VocabularyBackend,
                                                                                      VocabularyBackend]]) -> None:
    owner = _owner()
    a, b = servers(owner)
    glosses = ["Grüße", "日本語", 'say "hi"', "👋 wave"]
    vid = _teach(a, owner, [(g, seq) for g, (_x, seq) in zip(glosses, TAUGHT, strict=False)])
    assert b.get(owner, vid).glosses == 4 and [e["gloss"] for e in b.examples(owner, vid)] == glosses
    assert [e["gloss"] for e in b.export(owner, vid)["examples"]] == glosses
    for e in b.examples(owner, vid):  # the Lua step reads the gloss back from the example's JSON to uncount it
        a.delete_example(owner, vid, e["example_id"])
    assert b.get(owner, vid) == Vocabulary(vid, "signs", "sign", "en", b.get(owner, vid).created, 0, 0)
    assert a.stored_bytes(owner) == 0


def _race(*jobs: Callable[[], object]) -> tuple[int, list[QuotaExceeded]]:
    """Run ``jobs`` at once on threads; how many succeeded, and the refusals."""
    done: list[object] = []
    refused: list[QuotaExceeded] = []
    start = threading.Barrier(len(jobs))

    def run(job: Callable[[], object]) -> None:
        start.wait()
        try:
            done.append(job())
        except QuotaExceeded as exc:
            refused.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) + len(refused) == len(jobs)
    return len(done), refused


@needs_redis
def test_the_limits_hold_when_two_servers_write_at_once(servers: Callable[..., tuple[VocabularyBackend,
                                                                                      VocabularyBackend]]) -> None:
    owner, second, third = _owner(), _owner(), _owner()
    a, b = servers(owner, second, third, max_vocabularies_per_key=3, max_examples_per_vocabulary=5)
    made, refused = _race(*[lambda s=s: s.create(owner, "v", "sign") for s in (a, b) for _ in range(4)])
    assert made == 3 and len(a.list(owner)) == 3
    assert {e.details["limit"] for e in refused} == {"max_vocabularies_per_key"}

    vid = a.create(second, "signs", "sign").vocab_id
    gloss, seq = TAUGHT[0]
    made, refused = _race(*[lambda s=s: s.add_example(second, vid, gloss, seq) for s in (a, b) for _ in range(6)])
    assert made == 5 and b.get(second, vid).examples == 5
    assert {e.details["limit"] for e in refused} == {"max_examples_per_vocabulary"}

    size = a.stored_bytes(second) // 5  # one example's bytes
    a2, b2 = servers(max_vocabulary_bytes_per_key=max(1024, 3 * size + size // 2))
    vid = a2.create(third, "signs", "sign").vocab_id
    made, refused = _race(*[lambda s=s: s.add_example(third, vid, gloss, seq) for s in (a2, b2) for _ in range(4)])
    assert made == 3 and b2.stored_bytes(third) == 3 * size <= b2.max_bytes
    assert {e.details["limit"] for e in refused} == {"max_vocabulary_bytes_per_key"}
    a2.delete(third, vid)
    assert b2.stored_bytes(third) == 0


@needs_redis
def test_a_recogniser_built_on_one_server_follows_a_change_made_on_the_other(
        servers: Callable[..., tuple[VocabularyBackend, VocabularyBackend]]) -> None:
    owner = _owner()
    a, b = servers(owner)
    vid = _teach(a, owner, TAUGHT[:4])  # two glosses
    before = b.recogniser(owner, vid)
    assert b.recogniser(owner, vid) is before  # kept while nothing changes
    assert before.glosses == sorted({g for g, _s in TAUGHT[:4]})
    for gloss, seq in TAUGHT[4:6]:  # a third gloss, taught on A
        a.add_example(owner, vid, gloss, seq)
    after = b.recogniser(owner, vid)
    assert after is not before and TAUGHT[4][0] in after.glosses and len(after.examples) == 6
    assert after.recognise(TAUGHT[5][1]).gloss == TAUGHT[4][0]
    grown = a.recogniser(owner, vid)  # A's own, built after its change, is the same vocabulary
    assert len(grown.examples) == 6
    for e in a.examples(owner, vid)[4:]:
        a.delete_example(owner, vid, e["example_id"])
    assert TAUGHT[4][0] not in b.recogniser(owner, vid).glosses


@needs_redis
def test_copying_sqlites_vocabularies_keeps_everything_and_can_run_again(
        tmp_path: Path, servers: Callable[..., tuple[VocabularyBackend, VocabularyBackend]]) -> None:
    owner, other = _owner(), _owner()
    src = VocabularyStore(tmp_path / "sqlite")
    signs = _teach(src, owner, TAUGHT[:4])
    _teach(src, owner, LIPS, kind="lip")
    _teach(src, other, TAUGHT[4:])
    src.create(other, "empty", "lip", "de")
    dst, _b = servers(owner, other)

    assert copy_vocabularies(src, dst) == 4
    assert {owner, other} <= set(dst.owners()) and src.owners() == sorted([owner, other])

    def same() -> None:
        for who in (owner, other):
            assert dst.list(who) == src.list(who)  # ids, names, kinds, langs, created, counts
            assert dst.stored_bytes(who) == src.stored_bytes(who)
            for vocab in src.list(who):
                assert dst.examples(who, vocab.vocab_id) == src.examples(who, vocab.vocab_id)
                assert list(dst.stored_examples(who, vocab.vocab_id)) == list(src.stored_examples(who,
                                                                                               vocab.vocab_id))
                assert dst.export_json(who, vocab.vocab_id) == src.export_json(who, vocab.vocab_id)

    same()
    seq = TAUGHT[1][1]
    assert dst.recogniser(owner, signs).recognise(seq) == src.recogniser(owner, signs).recognise(seq)
    assert copy_vocabularies(src, dst) == 0  # again: nothing to write, nothing changed
    same()
    src.add_example(owner, signs, *TAUGHT[6])  # taught at the source since: the next run brings it
    assert copy_vocabularies(src, dst) == 1
    same()
    back = VocabularyStore(tmp_path / "back")  # and the way back, Redis to SQLite
    assert copy_vocabularies(dst, back, owners=[owner, other]) == 4
    for who in (owner, other):
        assert back.list(who) == src.list(who)
    back.close()
    src.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (scripts/setup.sh)")
def test_a_redis_that_is_down_is_store_unavailable_never_a_500(tmp_path: Path) -> None:
    redis = ManagedRedis(tmp_path / "redis")
    redis.start()
    owner = _owner()
    store = RedisVocabularyStore(redis.url, timeout_s=1.0)
    try:
        vid = _teach(store, owner, TAUGHT[:2])
        store.recogniser(owner, vid)
    finally:
        redis.stop()
    calls: list[Callable[[], object]] = [
        lambda: store.create(owner, "v", "sign"), lambda: store.list(owner), lambda: store.get(owner, vid),
        lambda: store.examples(owner, vid), lambda: store.add_example(owner, vid, *TAUGHT[2]),
        lambda: store.delete_example(owner, vid, "ex_0"), lambda: store.export_json(owner, vid),
        lambda: store.import_(owner, {"format": "linguafusion-vocabulary/1", "kind": "sign", "examples": []}),
        lambda: store.recogniser(owner, vid), lambda: store.delete(owner, vid), lambda: store.owners(),
        lambda: store.stored_bytes(owner)]
    for call in calls:
        with pytest.raises(StoreUnavailable) as caught:
            call()
        err: LinguaFusionError = caught.value
        assert (err.status, err.code, err.retryable) == (503, "state_store_unavailable", True)
        assert err.public_message == "the vocabulary store is unavailable; retry later"
        assert "127.0.0.1" not in err.public_message
    store.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (scripts/setup.sh)")
def test_two_real_servers_on_one_redis_are_one_vocabulary_service_and_503_without_it(tmp_path: Path) -> None:
    """Over HTTP: a vocabulary taught on server A is listed on, read from and recognised with on server B (own
    state directories, one Redis: a Redis of this test's own, so that no other test's "anonymous" key shares
    it); with that Redis gone, B's vocabulary routes answer 503 state_store_unavailable, never a 500."""
    import httpx
    from conftest import start_server, stop_server

    redis = ManagedRedis(tmp_path / "redis")
    redis.start()
    env = {"LINGUAFUSION_STATE__REDIS_URL": redis.url}
    procs = []
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        url_a, proc = start_server(tmp_path / "a", "--no-auth", env=env)
        procs.append(proc)
        url_b, proc = start_server(tmp_path / "b", "--no-auth", env=env)
        procs.append(proc)
        with httpx.Client(base_url=url_a, timeout=60) as a, httpx.Client(base_url=url_b, timeout=60) as b:
            r = a.post("/v1/vocabularies", json={"name": "signs", "kind": "sign"})
            assert r.status_code == 201, r.text
            vid = r.json()["vocabulary_id"]
            for gloss, seq in TAUGHT[:4]:
                r = a.post(f"/v1/vocabularies/{vid}/examples", json={"gloss": gloss, "frames": seq.to_json()})
                assert r.status_code == 201, r.text
            assert vid in [v["vocabulary_id"] for v in b.get("/v1/vocabularies").json()["vocabularies"]]
            assert [e["gloss"] for e in b.get(f"/v1/vocabularies/{vid}").json()["examples"]] == [
                g for g, _s in TAUGHT[:4]]
            r = b.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": TAUGHT[1][1].to_json()})
            assert r.status_code == 200 and r.json()["source_text"] == TAUGHT[1][0], r.text
            for gloss, seq in TAUGHT[4:6]:  # taught on A after B built its recogniser: B's is rebuilt
                assert a.post(f"/v1/vocabularies/{vid}/examples",
                              json={"gloss": gloss, "frames": seq.to_json()}).status_code == 201
            r = b.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": TAUGHT[5][1].to_json()})
            assert r.status_code == 200 and r.json()["source_text"] == TAUGHT[4][0], r.text

            redis.stop()
            for r in (b.get("/v1/vocabularies"), b.get(f"/v1/vocabularies/{vid}"),
                      b.post("/v1/vocabularies", json={"kind": "sign"}), b.delete(f"/v1/vocabularies/{vid}"),
                      b.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": TAUGHT[1][1].to_json()})):
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "state_store_unavailable", r.text
    finally:
        for proc in procs:
            stop_server(proc)
        redis.stop()
