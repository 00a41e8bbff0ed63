"""What users create lives in Redis when ``LINGUAFUSION_STATE__REDIS_URL`` is set (issue 31): two servers with
separate state directories and one Redis act as one service. Real redis-server (one per test module, fsync on every
write), real servers over HTTP, the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from conftest import BIN, start_server, stop_server
from prometheus_client.parser import text_string_to_metric_families
from redis import asyncio as aioredis

from lingua_fusion import MultimodalTranslator
from lingua_fusion.api.redis_tickets import RedisTicketBook
from lingua_fusion.config import Settings
from lingua_fusion.errors import (
    AuthenticationError,
    BackendError,
    NotFound,
    Overloaded,
    PermissionDenied,
    QuotaExceeded,
)
from lingua_fusion.glossary import Term
from lingua_fusion.lab.chaos.redis_server import ManagedRedis
from lingua_fusion.sdk.stream import StreamEvent
from lingua_fusion.state import redis_keys as rk
from lingua_fusion.state.redis_users import RedisUserStore
from lingua_fusion.state.sqlite import SQLiteStore
from lingua_fusion.stream.capacity import StreamCapacity
from lingua_fusion.stream.protocol import parse_start
from lingua_fusion.stream.redis_quota import RedisKeyQuota
from lingua_fusion.vision.redis_store import RedisVocabularyStore
from lingua_fusion.vision.store import VocabularyStore

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedRedis]:
    server = ManagedRedis(tmp_path_factory.mktemp("redis"), appendfsync="always")
    server.start()
    yield server
    server.stop()


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


# ---- the store ----------------------------------------------------------------------------------------------------
def test_a_key_made_through_one_store_authenticates_through_another_until_revoked(redis: ManagedRedis) -> None:
    a, b = RedisUserStore(redis.url), RedisUserStore(redis.url)
    try:
        secret, key = a.create_key("ci", ("translate",))
        assert b.authenticate(secret).key_id == key.key_id
        assert b.get_key(key.key_id) == key and key.key_id in {k.key_id for k in b.list_keys()}
        with pytest.raises(PermissionDenied):
            b.authenticate(secret, "admin")
        with pytest.raises(AuthenticationError):
            b.authenticate(secret[:-2] + "xx")  # a near miss is not the key
        assert b.revoked_among([key.key_id, "key_unknown"]) == set()
        a.revoke_key(key.key_id)
        with pytest.raises(AuthenticationError, match="revoked"):
            b.authenticate(secret)
        assert b.revoked_among([key.key_id]) == {key.key_id}
        with pytest.raises(NotFound):
            b.revoke_key("key_unknown")
    finally:
        a.close()
        b.close()


def test_glossaries_are_the_owner_s_alone_and_the_latest_is_the_default(redis: ManagedRedis) -> None:
    a, b = RedisUserStore(redis.url), RedisUserStore(redis.url)
    try:
        first = a.put_glossary("key_g1", "one", [Term("house", "mansión")], "en", "es")
        time.sleep(0.01)
        second = a.put_glossary("key_g1", "two", [Term("house", "hogar")], "en", None)
        assert b.latest_glossary("key_g1") == second and b.count_glossaries("key_g1") == 2
        meta, terms = b.get_glossary("key_g1", first)
        assert meta["name"] == "one" and meta["target_lang"] == "es" and terms == [Term("house", "mansión")]
        assert [g["glossary_id"] for g in b.list_glossaries("key_g1")] == [first, second]
        with pytest.raises(NotFound):  # another key's glossary is not found, never forbidden
            b.get_glossary("key_other", first)
        with pytest.raises(NotFound):
            b.delete_glossary("key_other", first)
        b.delete_glossary("key_g1", second)
        assert a.latest_glossary("key_g1") == first
    finally:
        a.close()
        b.close()


def test_two_gateways_cannot_both_add_a_key_s_last_glossary(redis: ManagedRedis) -> None:
    stores = [RedisUserStore(redis.url) for _ in range(2)]
    added: list[str] = []
    refused: list[str] = []
    start = threading.Barrier(16)

    def add(i: int) -> None:
        start.wait(10)
        try:
            added.append(stores[i % 2].put_glossary("key_race", f"g{i}", [Term("a", "b")], None, None, limit=5))
        except QuotaExceeded as exc:
            refused.append(str(exc.details.get("limit")))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(added) == 5 and refused == ["max_glossaries_per_key"] * 11
        assert stores[0].count_glossaries("key_race") == 5
    finally:
        for s in stores:
            s.close()


def test_a_redis_that_does_not_answer_is_a_typed_503_not_a_crash(tmp_path: Path) -> None:
    down = ManagedRedis(tmp_path / "down")  # never started: nothing listens on its port
    store = RedisUserStore(down.url, timeout_s=0.5)
    try:
        with pytest.raises(BackendError) as err:
            store.authenticate("sk_anything")
        assert err.value.status == 503 and err.value.code == "backend_unavailable"
    finally:
        store.close()


def test_a_redis_killed_and_restarted_on_its_aof_keeps_every_acknowledged_key_and_glossary(tmp_path: Path) -> None:
    redis = ManagedRedis(tmp_path / "redis", appendfsync="always")
    redis.start()
    try:
        store = RedisUserStore(redis.url)
        made = [store.create_key(f"k{i}") for i in range(20)]
        store.revoke_key(made[0][1].key_id)
        gids = [store.put_glossary(made[1][1].key_id, f"g{i}", [Term("house", f"casa{i}")], "en", "es")
                for i in range(5)]
        redis.kill()  # SIGKILL right after the last acknowledged write
        redis.start()  # same port, same append-only file
        with pytest.raises(AuthenticationError, match="revoked"):
            store.authenticate(made[0][0])
        assert all(store.authenticate(secret).key_id == key.key_id for secret, key in made[1:])
        assert [g["glossary_id"] for g in store.list_glossaries(made[1][1].key_id)] == gids
        store.close()
    finally:
        redis.stop()


# ---- migration ----------------------------------------------------------------------------------------------------
def test_state_migrate_moves_keys_and_glossaries_and_a_second_run_copies_nothing(tmp_path: Path,
                                                                                 redis: ManagedRedis) -> None:
    local = SQLiteStore(tmp_path)
    secret, key = local.create_key("moved", ("translate", "admin"))
    gone_secret, gone = local.create_key("gone")
    local.revoke_key(gone.key_id)
    gid = local.put_glossary(key.key_id, "terms", [Term("house", "mansión")], "en", "es")
    local.close()
    vocabularies = VocabularyStore(tmp_path)
    vocab = vocabularies.create(key.key_id, "greetings", "sign")
    vocabularies.close()
    url = redis.url.rsplit("/", 1)[0] + "/3"  # a database of its own: the counts below are this test's alone
    first = cli("state", "migrate", "--to", "redis", url, "--state-dir", str(tmp_path), env={})
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) | {"problems": []} == {
        "keys": 2, "keys_already_there": 0, "glossaries": 1, "glossaries_already_there": 0, "vocabularies": 1,
        "verified": True, "problems": []}
    shared = RedisUserStore(url)
    try:
        assert shared.authenticate(secret, "admin").key_id == key.key_id  # the key itself keeps working
        with pytest.raises(AuthenticationError, match="revoked"):
            shared.authenticate(gone_secret)
        assert shared.latest_glossary(key.key_id) == gid
        assert shared.get_glossary(key.key_id, gid)[1] == [Term("house", "mansión")]
    finally:
        shared.close()
    shared_vocabularies = RedisVocabularyStore(url)
    try:
        assert [v.vocab_id for v in shared_vocabularies.list(key.key_id)] == [vocab.vocab_id]
    finally:
        shared_vocabularies.close()
    later = SQLiteStore(tmp_path)  # revoked at the source after the first copy: the second carries it over
    later.revoke_key(key.key_id)
    later.close()
    again = cli("state", "migrate", "--to", "redis", url, "--state-dir", str(tmp_path), env={})
    shared = RedisUserStore(url)
    try:
        with pytest.raises(AuthenticationError, match="revoked"):
            shared.authenticate(secret)
    finally:
        shared.close()
    assert again.returncode == 0 and json.loads(again.stdout)["keys"] == 0
    assert json.loads(again.stdout)["vocabularies"] == 0
    assert json.loads(again.stdout)["keys_already_there"] == 2


def test_state_migrate_refuses_what_it_cannot_do_with_a_typed_error(tmp_path: Path) -> None:
    wrong = cli("state", "migrate", "--to", "postgres", "x", "--state-dir", str(tmp_path), env={})
    assert wrong.returncode == 2 and wrong.stderr.startswith("error [invalid_parameter]:"), wrong.stderr
    empty = cli("state", "migrate", "--to", "redis", "redis://127.0.0.1:1/0", "--state-dir", str(tmp_path / "x"),
                env={})
    assert empty.returncode == 2 and "no key store" in empty.stderr
    SQLiteStore(tmp_path).close()
    down = cli("state", "migrate", "--to", "redis", "redis://127.0.0.1:1/0", "--state-dir", str(tmp_path), env={})
    assert down.returncode == 2 and down.stderr.splitlines()[-1].startswith("error [backend_unavailable]:")


# ---- two servers, one Redis ---------------------------------------------------------------------------------------
def test_two_servers_on_separate_state_directories_and_one_redis_are_one_service(tmp_path: Path,
                                                                                redis: ManagedRedis) -> None:
    env = {"LINGUAFUSION_STATE__REDIS_URL": redis.url.rsplit("/", 1)[0] + "/4",
           "LINGUAFUSION_SERVER__KEY_CHECK_INTERVAL_S": "1", "LINGUAFUSION_SERVER__METRICS_PUBLISH_INTERVAL_S": "0.5"}
    made = cli("keys", "create", "--admin", "--state-dir", str(tmp_path / "cli"), env=env)
    assert made.returncode == 0, made.stderr
    admin = made.stdout.strip()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    left = SQLiteStore(tmp_path / "a")  # a key of the days before Redis: A's banner says how to move it
    left.create_key("old")
    left.close()
    a, proc_a = start_server(tmp_path / "a", env=env)
    banner = next((tmp_path / "a").glob("server-*.log")).read_text()
    assert "1 API key(s)" in banner and "state migrate --to redis" in banner, banner
    try:
        b, proc_b = start_server(tmp_path / "b", env=env)
        try:
            _one_service(a, b, admin)
        finally:
            stop_server(proc_b)
    finally:
        stop_server(proc_a)


def _one_service(a: str, b: str, admin: str) -> None:
    r = httpx.post(a + "/v1/keys", json={"name": "user"}, headers=auth(admin), timeout=30)
    assert r.status_code == 201, r.text
    user, user_id = r.json()["api_key"], r.json()["key_id"]
    text = {"text": "The house is big.", "source_lang": "en", "target_lang": "es"}
    on_b = httpx.post(b + "/v1/translate", data=text, headers=auth(user), timeout=120)
    assert on_b.status_code == 200, on_b.text  # minted on A, translates on B
    g = httpx.post(a + "/v1/glossaries", data={"terms": "house,mansión"}, headers=auth(user), timeout=30)
    assert g.status_code == 201, g.text
    with_glossary = httpx.post(b + "/v1/translate", data={**text, "enable_glossary": "true"}, headers=auth(user),
                               timeout=120)
    assert with_glossary.status_code == 200 and "mansión" in with_glossary.json()["text"], with_glossary.text
    listed = httpx.get(b + "/v1/glossaries", headers=auth(user), timeout=30).json()["glossaries"]
    assert [x["glossary_id"] for x in listed] == [g.json()["glossary_id"]]
    ticket = httpx.post(a + "/v1/stream-tickets", headers=auth(user), timeout=30).json()["ticket"]
    assert asyncio.run(_open_with_ticket(b, ticket)) == "ready"  # issued on A, redeemed on B
    assert asyncio.run(_open_with_ticket(a, ticket)) == "unauthenticated"  # once, anywhere
    assert httpx.delete(a + f"/v1/keys/{user_id}", headers=auth(admin), timeout=30).status_code == 200
    refused = httpx.post(b + "/v1/translate", data=text, headers=auth(user), timeout=30)  # revoked on A
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    _one_view(a, b, admin)


def _one_view(a: str, b: str, admin: str) -> None:
    """Either server's /metrics/cluster holds both replicas' pages, labelled; the ops page's cluster digest too."""
    ports = {a.rsplit(":", 1)[1], b.rsplit(":", 1)[1]}
    deadline = time.monotonic() + 30
    while True:
        page = httpx.get(b + "/metrics/cluster", headers=auth(admin), timeout=30)
        assert page.status_code == 200, page.text
        families = {f.name: f for f in text_string_to_metric_families(page.text)}
        replicas = {s.labels.get("replica", "") for s in families["linguafusion_requests"].samples}
        if {r.rsplit(":", 1)[-1] for r in replicas} >= ports or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert {r.rsplit(":", 1)[-1] for r in replicas} >= ports, replicas
    assert all(s.labels["role"] == "server" for s in families["linguafusion_requests"].samples)
    digest = httpx.get(a + "/v1/ops/metrics?scope=cluster", headers=auth(admin), timeout=30)
    assert digest.status_code == 200 and digest.json()["summary"], digest.text
    wrong = httpx.get(a + "/v1/ops/metrics?scope=everything", headers=auth(admin), timeout=30)
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid_parameter"


async def test_while_redis_is_down_requests_get_503_and_live_streams_keep_captioning(tmp_path: Path) -> None:
    redis = ManagedRedis(tmp_path / "redis", appendfsync="always")
    redis.start()
    env = {"LINGUAFUSION_STATE__REDIS_URL": redis.url, "LINGUAFUSION_SERVER__KEY_CHECK_INTERVAL_S": "1"}
    made = cli("keys", "create", "--state-dir", str(tmp_path), env=env)
    assert made.returncode == 0, made.stderr
    user = made.stdout.strip()
    url, proc = start_server(tmp_path, env=env)
    text = {"text": "The house is big.", "source_lang": "en", "target_lang": "es"}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c, \
                MultimodalTranslator(base_url=url, api_key=user).stream(["es"], slo="batch", partials=False) as s:
            events = aiter(s)
            await s.send_text("The dog is black.")
            assert (await _final(events)).text
            redis.kill()
            down = await c.post("/v1/translate", data=text, headers=auth(user))
            assert down.status_code == 503 and down.json()["error"]["code"] == "backend_unavailable", down.text
            await s.send_text("The weather is good today.")  # the open stream keeps captioning
            assert (await _final(events)).text
            await asyncio.sleep(2.5)  # the revocation watch fails twice meanwhile: it does not end the stream
            await s.send_text("I like the red car.")
            assert (await _final(events)).text
            await asyncio.to_thread(redis.start)  # same port, same append-only file: no restart of the server
            back = await c.post("/v1/translate", data=text, headers=auth(user))
            assert back.status_code == 200, back.text
            await s.end()
    finally:
        stop_server(proc)
        redis.stop()


async def _final(events: AsyncIterator[StreamEvent]) -> StreamEvent:
    async def first() -> StreamEvent:
        while True:
            ev = await anext(events)
            assert ev.type != "error", ev
            if ev.type == "final":
                return ev

    return await asyncio.wait_for(first(), 60)


async def _open_with_ticket(base: str, ticket: str) -> str:
    async with websockets.connect(base.replace("http", "ws", 1) + f"/v1/streams?ticket={ticket}") as ws:
        await ws.send(json.dumps({"type": "start", "inputs": ["text"], "source_lang": "en", "target_langs": ["es"]}))
        got = json.loads(await asyncio.wait_for(ws.recv(), 30))
        return str(got["type"] if got["type"] == "ready" else got["code"])


def test_a_stream_ticket_opens_one_stream_on_any_gateway_within_its_bounds(redis: ManagedRedis) -> None:
    a, b = RedisTicketBook(redis.url, per_key=3), RedisTicketBook(redis.url, per_key=3)
    try:
        issued = [book.issue("key_tk", False, 0.0) for book in (a, b, a, b)]
        assert [t is not None for t in issued] == [True, True, True, False]  # the key's bound, across books
        first = issued[0]
        assert first is not None and b.redeem(first.token, 0.0).key_id == "key_tk"
        with pytest.raises(AuthenticationError):
            a.redeem(first.token, 0.0)
        assert a.issue("key_tk", True, 0.0) is not None  # the redeemed one's place is free again
        assert b.revoke("key_tk") == 3
        with pytest.raises(AuthenticationError):
            a.redeem(str(issued[1].token if issued[1] else ""), 0.0)
    finally:
        a.close()
        b.close()


# ---- per-key stream quotas across gateways ------------------------------------------------------------------------
async def test_a_key_s_stream_cap_is_exact_across_gateways(redis: ManagedRedis) -> None:
    a, b = RedisKeyQuota(redis.url, 3), RedisKeyQuota(redis.url, 3)
    try:
        got = await asyncio.gather(*(q.take("key_cap", f"st_{i}") for i, q in enumerate([a, b] * 6)),
                                   return_exceptions=True)
        taken = [f"st_{i}" for i, r in enumerate(got) if r is None]
        assert len(taken) == 3 and all(isinstance(r, Overloaded) for r in got if r is not None)
        holder = a if int(taken[0].split("_")[1]) % 2 == 0 else b
        holder.give("key_cap", taken[0])
        await holder.sync()  # the release reaches Redis (the running server's loop sends it at once)
        await b.take("key_cap", "st_new")
        with pytest.raises(Overloaded):
            await a.take("key_cap", "st_one_more")
    finally:
        await a.close()
        await b.close()


async def test_a_resumed_stream_keeps_one_slot_and_a_dead_gateway_s_slots_lapse(redis: ManagedRedis) -> None:
    a, b = RedisKeyQuota(redis.url, 1, lease_s=1.0), RedisKeyQuota(redis.url, 1, lease_s=1.0)
    try:
        await a.take("key_resume", "st_1")
        await b.take("key_resume", "st_1")  # resumed on B: the same stream, so the same slot
        a.give("key_resume", "st_1")  # A's old session ends: the slot is B's now, A's release does nothing
        await a.sync()
        with pytest.raises(Overloaded):
            await a.take("key_resume", "st_2")
        await asyncio.sleep(1.3)  # B dies without renewing: its lease lapses
        await a.take("key_resume", "st_2")
    finally:
        await a.close()
        await b.close()


async def test_two_opens_of_one_stream_at_once_share_one_slot_and_one_admission(redis: ManagedRedis) -> None:
    """The second open arrives while the first waits on Redis for its slot: it waits for that answer instead of
    taking a slot and an admission of its own (which, refused, released the live stream's slot; review finding)."""
    quota = RedisKeyQuota(redis.url, 1)
    engine = OneStreamEngine()
    capacity = StreamCapacity(engine, Settings(), quota)  # type: ignore[arg-type]
    spec = parse_start({"type": "start", "source_lang": "en", "target_langs": ["es"], "inputs": ["text"]},
                       lambda _s, _t: None, [])
    try:
        first, second = await asyncio.gather(capacity.hold(spec, "key_twice"), capacity.hold(spec, "key_twice"))
        assert first is second and first.count == 2 and engine.admitted == {spec.stream_id}
        capacity.unhold(spec.stream_id, first)
        capacity.unhold(spec.stream_id, second)
        assert engine.admitted == set() and capacity.holds == {}
        await quota.sync()
        await quota.take("key_twice", "st_next")  # the slot came back
    finally:
        await quota.close()


class OneStreamEngine:
    """Room for one stream: a second reservation is refused."""

    def __init__(self) -> None:
        self.admitted: set[str] = set()

    def demand(self, stream_id: str, *_args: object) -> str:
        return stream_id

    async def reserve(self, demand: str, key_id: str = "") -> None:
        if self.admitted:
            raise Overloaded("full")
        self.admitted.add(demand)

    def release(self, stream_id: str) -> None:
        self.admitted.discard(stream_id)


async def test_a_gateway_back_after_its_leases_lapsed_does_not_push_a_key_past_its_cap(redis: ManagedRedis) -> None:
    a, b = RedisKeyQuota(redis.url, 1, lease_s=1.0), RedisKeyQuota(redis.url, 1, lease_s=1.0)
    try:
        await a.take("key_lapse", "st_a")
        await asyncio.sleep(1.3)  # A is cut off from Redis past its lease: its slot lapses
        await b.take("key_lapse", "st_b")  # so B may take the key's one slot
        await a.sync()  # A is back and renews: its lapsed slot does not come back over the cap
        r = aioredis.from_url(redis.url, decode_responses=True)
        assert await r.zrange(rk.stream_quota("key_lapse"), 0, -1) == ["st_b"]
        await r.aclose()
    finally:
        await a.close()
        await b.close()
