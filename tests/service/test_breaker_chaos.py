"""The SLO circuit breaker against a delay fault injected into a live server (--chaos, admin only)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from conftest import Server, start_server, stop_server

from lingua_fusion import MultimodalTranslator


def test_fault_injection_needs_chaos_mode_and_an_admin_key(server: Server) -> None:
    admin = {"Authorization": f"Bearer {server.admin_key}"}
    r = httpx.post(server.url + "/v1/admin/faults", json={"model": "mt", "delay_s": 1}, headers=admin, timeout=10)
    assert r.status_code == 403 and "--chaos" in r.json()["error"]["message"]
    user = {"Authorization": f"Bearer {server.key()}"}
    assert httpx.get(server.url + "/v1/admin/faults", headers=user, timeout=10).status_code == 403
    assert httpx.delete(server.url + "/v1/admin/breaker", headers=user, timeout=10).status_code == 403
    assert httpx.get(server.url + "/v1/admin/breaker", headers=admin, timeout=10).json()["breaker"] == {
        "interactive": 0, "standard": 0, "batch": 0}


async def test_breaker_trips_on_a_delay_fault_and_recovers(tmp_path: Path) -> None:
    url, proc = start_server(tmp_path, "--no-auth", "--chaos", env={"LINGUAFUSION_SERVER__BREAKER_WINDOW_S": "2",
                                                                    "LINGUAFUSION_SERVER__BREAKER_K": "2"})
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            r = await http.post("/v1/admin/faults", json={"model": "mt", "delay_s": 3.5})
            assert r.status_code == 201
            t = MultimodalTranslator(base_url=url)
            events: list[tuple[float, str, dict[str, object]]] = []
            async with t.stream(["es"], slo="standard", partials=False) as s:
                t0 = time.monotonic()

                async def send() -> None:
                    cleared = False
                    for _ in range(160):  # at most 80 s; stops as soon as the class is restored
                        await s.send_text("The house is very big.")
                        await asyncio.sleep(0.5)
                        if not cleared and any(k == "degraded" for _t, k, _e in events):
                            await http.delete("/v1/admin/faults")
                            cleared = True
                        if any(k == "restored" for _t, k, _e in events):
                            break
                    await s.end()

                sender = asyncio.create_task(send())
                async for ev in s:
                    events.append((time.monotonic() - t0, ev.type, ev.model_dump()))
                await sender
            metrics = (await http.get("/metrics")).text
    finally:
        stop_server(proc)
    kinds = [k for _t, k, _e in events]
    assert "degraded" in kinds and "restored" in kinds and kinds.index("degraded") < kinds.index("restored")
    assert next(e for _t, k, e in events if k == "degraded").get("step") == "drop_partials"
    finals = [e for _t, k, e in events if k == "final"]
    assert [f["seq"] for f in finals] == list(range(1, len(finals) + 1))  # degrading lost no caption
    def counter(direction: str) -> float:
        name = f'linguafusion_breaker_transitions_total{{direction="{direction}",slo="standard"}} '
        return next(float(x[len(name):]) for x in metrics.splitlines() if x.startswith(name))

    # every move is counted: as many degrade as degraded events, as many restores as restored events
    assert counter("degrade") == kinds.count("degraded") >= 1
    assert counter("restore") == kinds.count("restored") >= 1


async def test_an_admin_restores_a_tripped_breaker_at_once(tmp_path: Path) -> None:
    """A class degraded by a (now cleared) delay fault refuses new streams until its quiet period ends; an admin's
    DELETE /v1/admin/breaker lets them in at once (and a model whose cost was measured during the slow spell
    takes the first stream again: its measure can only relearn from work it serves)."""
    from lingua_fusion.errors import Overloaded

    url, proc = start_server(tmp_path, "--no-auth", "--chaos", env={"LINGUAFUSION_SERVER__BREAKER_WINDOW_S": "2",
                                                                    "LINGUAFUSION_SERVER__BREAKER_K": "2"})
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.post("/v1/admin/faults", json={"model": "mt", "delay_s": 3.5})).status_code == 201
            t = MultimodalTranslator(base_url=url)
            kinds: list[str] = []
            async with t.stream(["es"], slo="standard", partials=False) as s:
                async def send() -> None:
                    for _ in range(120):  # at most 60 s, until the class is degraded
                        await s.send_text("The house is very big.")
                        await asyncio.sleep(0.5)
                        if "degraded" in kinds:
                            break
                    await s.end()

                sender = asyncio.create_task(send())
                async for ev in s:
                    kinds.append(ev.type)
                await sender
            assert "degraded" in kinds
            await http.delete("/v1/admin/faults")
            with pytest.raises(Overloaded) as refused:  # the breaker's refusal (within its 60 s quiet period)
                async with t.stream(["es"], slo="standard", partials=False):
                    pass
            assert refused.value.details["breaker_level"] >= 1
            assert (await http.get("/v1/admin/breaker")).json()["breaker"]["standard"] >= 1
            r = await http.delete("/v1/admin/breaker")
            assert r.status_code == 200 and r.json()["breaker"]["standard"] == 0
            async with t.stream(["es"], slo="standard", partials=False) as fresh:  # admitted now
                await fresh.send_text("The house is very big.")
                await fresh.end()
                finals = [ev async for ev in fresh if ev.type == "final"]
            assert len(finals) == 1 and "casa" in finals[0].model_dump()["translations"]["es"].lower()
    finally:
        stop_server(proc)
