"""Who may listen to a room, on a live server with auth on (issue 29): listener tokens revoked one by one, dead once
their room is deleted or their owner's key revoked, the languages a listener may pick, and the caps on the rooms a
key keeps. Near misses side by side: two rooms and two keys at once, a revoked token next to a sibling that still
works, a cap at exactly its limit and one past it, an allowed language next to one that is not."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import BIN, start_server, stop_server
from test_rooms import Publisher, finals_of, listen_ws
from websockets.exceptions import ConnectionClosed

MAX_OPEN = 3
MAX_ENDED = 1
NAMES = ("admin", "a", "b", "c", "d", "e", "f")


class Guarded:
    """A server whose keys are known by name: ``secret[name]``, ``key_id[name]``."""

    def __init__(self, url: str, secret: dict[str, str], key_id: dict[str, str], state: Path) -> None:
        self.url, self.secret, self.key_id, self.state = url, secret, key_id, state

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://")

    def h(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret[name]}"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    state = tmp_path_factory.mktemp("rooms-access")
    secret = {}
    for name in NAMES:
        extra = ["--admin"] if name == "admin" else []
        secret[name] = subprocess.run([str(BIN), "keys", "create", "--name", name, *extra, "--state-dir", str(state)],
                                      capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    url, proc = start_server(state, env={"LINGUAFUSION_ROOMS__MAX_OPEN_PER_KEY": str(MAX_OPEN),
                                         "LINGUAFUSION_ROOMS__MAX_ENDED_PER_KEY": str(MAX_ENDED)})
    listed = httpx.get(url + "/v1/keys", headers={"Authorization": f"Bearer {secret['admin']}"}, timeout=30).json()
    key_id = {k["name"]: k["key_id"] for k in listed["keys"]}
    yield Guarded(url, secret, key_id, state)
    stop_server(proc)


async def sse_status(http: httpx.AsyncClient, room_id: str, token: str, targets: str = "es") -> tuple[int, Any]:
    """Open the room's event stream with ``token``: its status, and the error body when refused."""
    async with http.stream("GET", f"/v1/rooms/{room_id}/events?targets={targets}",
                           headers={"Authorization": f"Bearer {token}"}) as r:
        if r.status_code == 200:
            return 200, None
        return r.status_code, json.loads(await r.aread())["error"]


async def refused_ws(g: Guarded, room_id: str, token: str, targets: str) -> tuple[dict[str, Any], int | None]:
    ws = await listen_ws(g.ws, room_id, token, targets)
    error = json.loads(await asyncio.wait_for(ws.recv(), 30))
    await ws.wait_closed()
    return error, ws.close_code


async def closed_by_server(ws: Any) -> list[dict[str, Any]]:
    """What an open listener gets until its socket closes (normally or not: ``ws.close_code`` says)."""
    got: list[dict[str, Any]] = []

    async def read() -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                got.append(json.loads(await ws.recv()))

    await asyncio.wait_for(read(), 30)
    return got


# ---- two rooms, two keys -----------------------------------------------------------------------------------------
async def test_a_token_opens_its_own_room_only_and_another_key_cannot_list_or_revoke_it(guarded: Guarded) -> None:
    g = guarded
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        one = (await http.post("/v1/rooms", headers=g.h("a"), json={"source_lang": "en"})).json()
        two = (await http.post("/v1/rooms", headers=g.h("a"), json={"source_lang": "en"})).json()
        theirs = (await http.post("/v1/rooms", headers=g.h("b"), json={"source_lang": "en"})).json()
        assert one["token_id"].startswith("tk_") and one["token_id"] != two["token_id"]
        # a token of room 1 does not open room 2 (the same key's) nor key B's room; each opens its own
        for room, token in ((two, one), (theirs, one), (one, theirs)):
            status, error = await sse_status(http, room["room_id"], token["listener_token"])
            assert (status, error["code"]) == (401, "unauthenticated"), error
        for room in (one, two, theirs):
            assert (await sse_status(http, room["room_id"], room["listener_token"]))[0] == 200
        # the owner lists its room's tokens by id (never the token or its digest); a label says whose it is
        minted = (await http.post(f"/v1/rooms/{one['room_id']}/tokens", headers=g.h("a"),
                                  json={"label": "front row"})).json()
        assert minted["token_id"].startswith("tk_") and minted["label"] == "front row"
        listed = (await http.get(f"/v1/rooms/{one['room_id']}/tokens", headers=g.h("a"))).json()["tokens"]
        assert [(t["token_id"], t["label"]) for t in listed] == [(one["token_id"], None),
                                                                  (minted["token_id"], "front row")]
        assert one["listener_token"] not in json.dumps(listed)
        # key B can neither list nor revoke key A's tokens: 404, as for a room that does not exist
        r = await http.get(f"/v1/rooms/{one['room_id']}/tokens", headers=g.h("b"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await http.delete(f"/v1/rooms/{one['room_id']}/tokens/{one['token_id']}", headers=g.h("b"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        # nor with its own room's path: a token id is of one room only
        r = await http.delete(f"/v1/rooms/{theirs['room_id']}/tokens/{one['token_id']}", headers=g.h("b"))
        assert r.status_code == 404
        assert (await sse_status(http, one["room_id"], one["listener_token"]))[0] == 200  # still works
        # a listener token is no API key for these routes either
        r = await http.get(f"/v1/rooms/{one['room_id']}/tokens",
                           headers={"Authorization": f"Bearer {one['listener_token']}"})
        assert r.status_code == 401
        for room, key in ((one, "a"), (two, "a"), (theirs, "b")):
            assert (await http.delete(f"/v1/rooms/{room['room_id']}", headers=g.h(key))).status_code == 200


# ---- one token revoked, its sibling still works ------------------------------------------------------------------
async def test_a_revoked_token_is_refused_and_its_socket_closed_while_a_sibling_token_still_listens(
        guarded: Guarded) -> None:
    g = guarded
    pub = await Publisher.open(g.ws, g.secret["a"], ["es"])
    room_id, first = pub.ready["room_id"], pub.ready["listener_token"]
    first_id = pub.ready["listener_token_id"]
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        sibling = (await http.post(f"/v1/rooms/{room_id}/tokens", headers=g.h("a"))).json()["listener_token"]
        doomed_ws, sibling_ws = await listen_ws(g.ws, room_id, first, "es"), await listen_ws(g.ws, room_id, sibling,
                                                                                              "es")
        said = await pub.say("Good morning.")
        for ws in (doomed_ws, sibling_ws):  # both have joined
            assert json.loads(await asyncio.wait_for(ws.recv(), 30))["seq"] == said["seq"]
        r = await http.delete(f"/v1/rooms/{room_id}/tokens/{first_id}", headers=g.h("a"))
        assert r.status_code == 200 and r.json() == {**r.json(), "revoked": True, "listeners_closed": 1}
        got = await closed_by_server(doomed_ws)
        assert got[-1]["type"] == "error" and got[-1]["code"] == "unauthenticated" and "revoked" in got[-1]["message"]
        assert doomed_ws.close_code == 4401
        status, error = await sse_status(http, room_id, first)  # opening the room again: refused
        assert (status, error["code"]) == (401, "unauthenticated")
        assert (await sse_status(http, room_id, sibling))[0] == 200  # the sibling opens it
        after = await pub.say("The sibling still hears this.")
        await pub.end()
        heard = finals_of(await closed_by_server(sibling_ws))
        assert [f["seq"] for f in heard] == [after["seq"]]
        listed = (await http.get(f"/v1/rooms/{room_id}/tokens", headers=g.h("a"))).json()["tokens"]
        assert first_id not in [t["token_id"] for t in listed] and len(listed) == 1
        r = await http.delete(f"/v1/rooms/{room_id}/tokens/{first_id}", headers=g.h("a"))  # already gone
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


# ---- a deleted room ----------------------------------------------------------------------------------------------
async def test_after_delete_a_rooms_tokens_open_neither_the_room_nor_its_history(guarded: Guarded) -> None:
    g = guarded
    pub = await Publisher.open(g.ws, g.secret["b"], ["es"])
    room_id, token = pub.ready["room_id"], pub.ready["listener_token"]
    listener = await listen_ws(g.ws, room_id, token, "es")
    said = await pub.say("Good morning.")
    assert json.loads(await asyncio.wait_for(listener.recv(), 30))["seq"] == said["seq"]  # it has joined
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        r = await http.delete(f"/v1/rooms/{room_id}", headers=g.h("b"))
        assert r.status_code == 200 and r.json()["state"] == "ended" and r.json()["deleted"] is True
        got = await closed_by_server(listener)
        assert got[-1] == {**got[-1], "type": "closed", "reason": "ended by its owner"}
        assert listener.close_code == 1000
        status, error = await sse_status(http, room_id, token)  # the history (after_seq=0) with the same token
        assert (status, error["code"]) == (404, "not_found")
        error, code = await refused_ws(g, room_id, token, "es")
        assert (error["code"], code) == ("not_found", 4404)
        assert (await http.get(f"/v1/rooms/{room_id}", headers=g.h("b"))).status_code == 404
        assert room_id not in [r["room_id"] for r in (await http.get("/v1/rooms", headers=g.h("b"))).json()["rooms"]]
        r = await http.post(f"/v1/rooms/{room_id}/tokens", headers=g.h("b"))
        assert r.status_code == 404
    await pub.say("The stream goes on unpublished.")
    await pub.end()


# ---- the owner's key revoked -------------------------------------------------------------------------------------
async def test_a_token_after_its_owners_key_is_revoked_is_refused_and_open_listeners_are_closed(
        guarded: Guarded) -> None:
    g = guarded
    pub = await Publisher.open(g.ws, g.secret["c"], ["es"])
    room_id, token = pub.ready["room_id"], pub.ready["listener_token"]
    listener = await listen_ws(g.ws, room_id, token, "es")
    said = await pub.say("Good morning.")
    assert json.loads(await asyncio.wait_for(listener.recv(), 30))["seq"] == said["seq"]  # it has joined
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        waiting = (await http.post("/v1/rooms", headers=g.h("c"))).json()  # a second room of the key, never published
        near = (await http.post("/v1/rooms", headers=g.h("d"))).json()  # another key's room: untouched
        r = await http.delete(f"/v1/keys/{g.key_id['c']}", headers=g.h("admin"))
        assert r.status_code == 200 and r.json()["room_listeners_closed"] == 1
        got = await closed_by_server(listener)
        assert got[-1]["type"] == "error" and got[-1]["code"] == "unauthenticated"
        assert "owner key was revoked" in got[-1]["message"] and listener.close_code == 4401
        for room_id_, token_ in ((room_id, token), (waiting["room_id"], waiting["listener_token"])):
            status, error = await sse_status(http, room_id_, token_)
            assert status in (401, 404) and error["code"] in ("unauthenticated", "not_found"), error
        assert (await sse_status(http, near["room_id"], near["listener_token"]))[0] == 200
        # revoked with the CLI, out of the server: the key store is asked at each join
        cli = (await http.post("/v1/rooms", headers=g.h("e"))).json()
        assert (await sse_status(http, cli["room_id"], cli["listener_token"]))[0] == 200
        await asyncio.to_thread(subprocess.run, [str(BIN), "keys", "revoke", g.key_id["e"], "--state-dir",
                                                 str(g.state)], check=True, capture_output=True, timeout=60)
        status, error = await sse_status(http, cli["room_id"], cli["listener_token"])
        assert (status, error["code"]) == (401, "unauthenticated") and "revoked" in error["message"]
        await http.delete(f"/v1/rooms/{near['room_id']}", headers=g.h("d"))


# ---- which languages a listener may pick -------------------------------------------------------------------------
async def test_a_listener_picks_among_the_rooms_allowed_languages_only(guarded: Guarded) -> None:
    g = guarded
    pub = await Publisher.open(g.ws, g.secret["f"], ["es"], room_targets=["ca"])
    room_id, token = pub.ready["room_id"], pub.ready["listener_token"]
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        status, error = await sse_status(http, room_id, token, "fr")  # served by the server, not allowed here
        assert (status, error["code"]) == (403, "target_not_allowed") and error["details"]["allowed"] == ["ca",
                                                                                                          "en", "es"]
        error, code = await refused_ws(g, room_id, token, "es,fr")
        assert (error["code"], code) == ("target_not_allowed", 4403)
        catalan = await listen_ws(g.ws, room_id, token, "ca")  # allowed: the publisher adds it while it is heard
        for _ in range(150):  # the publisher reads who listens every 0.5 s
            final = await pub.say("The river is long.")
            if "ca" in final["translations"]:
                break
            await asyncio.sleep(0.2)
        assert "ca" in final["translations"] and "fr" not in final["translations"]
        # a room made by REST with allowed_targets refuses the others before any publisher came
        made = (await http.post("/v1/rooms", headers=g.h("f"),
                                json={"source_lang": "en", "allowed_targets": ["fr"]})).json()
        assert made["allowed_targets"] == ["fr"]
        status, error = await sse_status(http, made["room_id"], made["listener_token"], "ca")
        assert (status, error["code"]) == (403, "target_not_allowed")
        assert (await sse_status(http, made["room_id"], made["listener_token"], "fr"))[0] == 200
        r = await http.post("/v1/rooms", headers=g.h("f"), json={"source_lang": "en", "allowed_targets": ["ja"]})
        assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_pair"
        # a REST room without allowed_targets: early listeners join; when the publisher comes with its targets, one
        # outside them is closed (4403), one inside stays
        await http.delete(f"/v1/rooms/{made['room_id']}", headers=g.h("f"))
        await pub.end()
        heard = finals_of(await closed_by_server(catalan))
        assert heard and "ca" in heard[-1]["translations"]
        open_ = (await http.post("/v1/rooms", headers=g.h("f"), json={"source_lang": "en"})).json()
        early_fr = await listen_ws(g.ws, open_["room_id"], open_["listener_token"], "fr")
        early_es = await listen_ws(g.ws, open_["room_id"], open_["listener_token"], "es")
        for _ in range(100):  # both have joined (presence is written as each joins)
            if (await http.get(f"/v1/rooms/{open_['room_id']}", headers=g.h("f"))).json()["listeners"] == 2:
                break
            await asyncio.sleep(0.1)
        late = await Publisher.open(g.ws, g.secret["f"], ["es"], room=open_["room_id"])
        got = await closed_by_server(early_fr)
        assert got[-1]["code"] == "target_not_allowed" and early_fr.close_code == 4403
        said = await late.say("Good morning.")
        await late.end()
        assert [f["seq"] for f in finals_of(await closed_by_server(early_es))] == [said["seq"]]


# ---- how many rooms a key keeps ----------------------------------------------------------------------------------
async def test_open_rooms_are_capped_at_exactly_the_limit_and_ended_ones_are_evicted_oldest_first(
        guarded: Guarded) -> None:
    g = guarded
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        mine = [(await http.post("/v1/rooms", headers=g.h("d"))) for _ in range(MAX_OPEN)]
        assert [r.status_code for r in mine] == [201] * MAX_OPEN  # exactly the limit
        past = await http.post("/v1/rooms", headers=g.h("d"))  # one past it
        assert past.status_code == 403
        assert past.json()["error"]["code"] == "quota_exceeded"
        assert past.json()["error"]["details"] == {"limit": "max_rooms_per_key", "max": MAX_OPEN}
        other = await http.post("/v1/rooms", headers=g.h("b"))  # the cap is per key
        assert other.status_code == 201
        await http.delete(f"/v1/rooms/{other.json()['room_id']}", headers=g.h("b"))
        # ending (the stream ends) frees a place; the ended room stays readable, up to MAX_ENDED of them
        ended = []
        for made in mine[:2]:
            room_id = made.json()["room_id"]
            pub = await Publisher.open(g.ws, g.secret["d"], ["es"], room=room_id)
            await pub.say("Good morning.")
            await pub.end()
            for _ in range(100):
                if (await http.get(f"/v1/rooms/{room_id}", headers=g.h("d"))).json().get("state") == "ended":
                    break
                await asyncio.sleep(0.1)
            ended.append(made.json())
        oldest, newest = ended
        assert (await http.get(f"/v1/rooms/{oldest['room_id']}", headers=g.h("d"))).status_code == 404  # evicted
        status, error = await sse_status(http, oldest["room_id"], oldest["listener_token"])
        assert (status, error["code"]) == (404, "not_found")
        async with http.stream("GET", f"/v1/rooms/{newest['room_id']}/events?targets=es",
                               headers={"Authorization": f"Bearer {newest['listener_token']}"}) as r:
            assert r.status_code == 200
            body = (await r.aread()).decode()
        assert "event: final" in body and "event: closed" in body  # its history, then closed
        assert (await http.post("/v1/rooms", headers=g.h("d"))).status_code == 201  # a place again
        listed = (await http.get("/v1/rooms", headers=g.h("d"))).json()["rooms"]
        assert sorted(r["state"] for r in listed) == ["ended", "waiting", "waiting"]
