"""JSON depth and element bounds (json_bounds.py) on real servers' routes, exactly at each bound and one past it:
landmark examples (``vision.max_json_elements``), rooms and a stream's messages (``limits.max_json_elements``),
all of them ``limits.max_json_depth``. One past is 413 ``too_large`` naming the bound where, without it, the body
would have been parsed (and refused as invalid, or taken). Servers: ``create_app`` under uvicorn in the test's
event loop (tests/service/test_promises.py ``serve``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from test_promises import Wire, serve, settings_for, text_start

from lingua_fusion.config import Settings
from lingua_fusion.json_bounds import measure
from lingua_fusion.vision import synthetic as syn

WAIT_S = 60.0
JSON = {"Content-Type": "application/json"}


def bounded(tmp: Path, depth: int, elements: int, landmark_elements: int = 4_000_000) -> Settings:
    s = settings_for(tmp)
    s.limits.max_json_depth, s.limits.max_json_elements = depth, elements
    s.vision.max_json_elements = landmark_elements
    return s


def refused(r: httpx.Response, limit: str) -> None:
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["code"] == "too_large" and error["details"]["limit"] == limit, error


def example() -> dict[str, Any]:
    frames = syn.perform_sign(syn.sign_vocabulary(1, seed=3)[0], syn.Performance(), np.random.default_rng(0))
    return {"gloss": "hello", "frames": frames.to_json()}


def dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


async def test_a_landmark_example_of_exactly_the_element_bound_is_taken_one_more_is_refused(tmp_path: Path) -> None:
    body = example()
    exact = dumps(body)
    elements = measure(exact).elements
    assert measure(exact).depth == 5 and elements > 1000
    async with serve(bounded(tmp_path, 5, 100, landmark_elements=elements)) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S, headers=JSON) as c:
        vid = (await c.post("/v1/vocabularies", content=b'{"kind":"sign"}')).json()["vocabulary_id"]
        ok = await c.post(f"/v1/vocabularies/{vid}/examples", content=exact)
        assert ok.status_code == 201, ok.text
        one_more = exact[:-1] + b',"x":1}'  # one comma more (without the bound: 400, an unknown field)
        assert measure(one_more).elements == elements + 1
        refused(await c.post(f"/v1/vocabularies/{vid}/examples", content=one_more), "max_json_elements")
        # the recognition route takes the same bound
        rec = dumps({"frames": body["frames"], "target_lang": "es"})
        assert measure(rec).elements <= elements
        assert (await c.post(f"/v1/vocabularies/{vid}/recognise", content=rec)).status_code == 200


async def test_a_landmark_example_exactly_max_json_depth_deep_is_taken_one_deeper_is_refused(tmp_path: Path) -> None:
    body = example()
    async with serve(bounded(tmp_path, 5, 100)) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S, headers=JSON) as c:
        vid = (await c.post("/v1/vocabularies", content=b'{"kind":"sign"}')).json()["vocabulary_id"]
        ok = await c.post(f"/v1/vocabularies/{vid}/examples", content=dumps(body))
        assert ok.status_code == 201, ok.text
        deeper = copy.deepcopy(body)
        part = next(k for k in ("right_hand", "left_hand", "pose") if deeper["frames"][0].get(k))
        deeper["frames"][0][part][0] = [deeper["frames"][0][part][0]]  # one point one level deeper: 6
        assert measure(dumps(deeper)).depth == 6
        refused(await c.post(f"/v1/vocabularies/{vid}/examples", content=dumps(deeper)), "max_json_depth")


async def test_a_room_body_exactly_at_each_bound_is_taken_one_past_is_refused(tmp_path: Path) -> None:
    at = b'{"source_lang":"en","allowed_targets":["es","fr"]}'  # { , [ , : 4 elements, 2 deep
    assert (measure(at).depth, measure(at).elements) == (2, 4)
    async with serve(bounded(tmp_path, 2, 4)) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S, headers=JSON) as c:
        ok = await c.post("/v1/rooms", content=at)
        assert ok.status_code == 201 and ok.json()["allowed_targets"] == ["es", "fr"], ok.text
        refused(await c.post("/v1/rooms", content=b'{"source_lang":"en","allowed_targets":["es","fr","de"]}'),
                "max_json_elements")
        deeper = b'{"allowed_targets":[["es"]]}'  # 3 elements, 3 deep (without the bound: 400 invalid_parameter)
        refused(await c.post("/v1/rooms", content=deeper), "max_json_depth")
        token = await c.post(f"/v1/rooms/{ok.json()['room_id']}/tokens", content=b'{"label":"door"}')
        assert token.status_code == 201, token.text


async def test_a_stream_message_exactly_max_json_depth_deep_is_taken_one_deeper_ends_the_stream(
        tmp_path: Path) -> None:
    async with serve(bounded(tmp_path, 3, 20)) as (host, _app):
        ok = await Wire.open(host, text_start())
        await ok.first("ready")
        await ok.send(type="text", text="The house is big.", ts=1.0, note=[["deep"]])  # 3 deep: taken
        await ok.send(type="end")
        assert await ok.closed() == 1000
        assert [e["type"] for e in ok.got if e["type"] in ("final", "error")] == ["final"], ok.got
        over = await Wire.open(host, text_start())
        await over.first("ready")
        await over.send(type="text", text="The house is big.", ts=1.0, note=[[["deep"]]])  # 4 deep
        assert await over.closed() == 4413
        errors = [e for e in over.got if e["type"] == "error"]
        assert [e["code"] for e in errors] == ["too_large"] and errors[0]["details"]["limit"] == "max_json_depth"


async def test_a_stream_message_of_exactly_max_json_elements_is_taken_one_more_ends_the_stream(
        tmp_path: Path) -> None:
    def text(n: int) -> str:  # { , , , [ and n-1 commas: 4 + n elements
        return json.dumps({"type": "text", "text": "The house is big.", "ts": 1.0, "note": ["x"] * n})

    assert measure(text(16)).elements == 20
    async with serve(bounded(tmp_path, 8, 20)) as (host, _app):
        ok = await Wire.open(host, text_start())
        await ok.first("ready")
        await ok.ws.send(text(16))
        await ok.send(type="end")
        assert await ok.closed() == 1000
        assert [e["type"] for e in ok.got if e["type"] in ("final", "error")] == ["final"], ok.got
        over = await Wire.open(host, text_start())
        await over.first("ready")
        await over.ws.send(text(17))
        assert await over.closed() == 4413
        errors = [e for e in over.got if e["type"] == "error"]
        assert errors[0]["details"]["limit"] == "max_json_elements", errors
