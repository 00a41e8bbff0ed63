"""The cluster's pure parts and the gateway's ModelPort against a fake deployment handle (the real cluster is in
tests/e2e/test_cluster.py): what crosses the hop, the autoscaling decision, and the retry contract of the port."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from lingua_fusion.cluster.autoscale import PressureWindow, ScalePolicy, decide, slo_policy
from lingua_fusion.cluster.port import ClusterExecutor
from lingua_fusion.cluster.wire import Call, Reply
from lingua_fusion.config import Settings
from lingua_fusion.errors import BackendError, ModelTimeout, Overloaded
from lingua_fusion.models.registry import Registry
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, CallContext, MtInput


def test_a_call_keeps_the_captions_age_across_clocks() -> None:
    ctx = CallContext("st_1", slo="interactive", importance=0.9, tentative=False, start=100.0, key_id="k1")
    call = Call.make(ModelKey.mt("en", "es"), MtInput("hello"), ctx, now=100.4)
    there = call.context(now=5000.0)  # the replica's clock is another machine's
    assert there.start == pytest.approx(4999.6)
    assert (there.stream_id, there.slo, there.importance, there.key_id) == ("st_1", "interactive", 0.9, "k1")
    assert call.model_key() == ModelKey.mt("en", "es")
    assert Call.make(ModelKey.asr("en"), None, CallContext("s"), now=1.0).context(now=9.0).start is None


def test_a_reply_rebuilds_the_typed_error_on_the_gateway() -> None:
    with pytest.raises(Overloaded) as err:
        Reply.failed(Overloaded("the asr:tiny.en queue is full", retry_after=3.0), depth=256).result()
    assert err.value.retry_after == 3.0 and err.value.code == "overloaded"
    with pytest.raises(ModelTimeout):
        Reply.failed(ModelTimeout("slow"), depth=0).result()
    assert Reply.ok("hola", depth=2).result() == "hola"


@pytest.mark.parametrize(("current", "depth", "pressure", "want"), [
    (1, 0, 0.0, 1),      # idle: stays (Serve's min_replicas bounds it)
    (1, 30, 0.5, 4),     # 30 queued, 8 per replica
    (2, 4, 0.9, 3),      # short queues but the budget is used up: one more
    (3, 4, 0.1, 2),      # short queues and headroom: one fewer, not straight to 1
    (3, 4, 0.6, 3),      # short queues but not much headroom: stays
    (2, 20, 0.1, 3),     # headroom, yet the queues need 3
])
def test_the_replica_count_follows_queue_depth_and_slo_headroom(current: int, depth: int, pressure: float,
                                                                want: int) -> None:
    assert decide(current, depth, pressure, ScalePolicy()) == want


def test_pressure_is_the_p90_of_the_last_window() -> None:
    w = PressureWindow(window_s=10.0)
    assert w.p90(0.0) == 0.0
    for i in range(10):
        w.record(float(i), 0.1 * (i + 1))  # 0.1 .. 1.0
    assert w.p90(9.0) == pytest.approx(1.0)
    assert w.p90(25.0) == 0.0  # all older than the window


def test_the_serve_policy_reads_the_replicas_recorded_stats() -> None:
    ctx = SimpleNamespace(current_num_replicas=2, aggregated_metrics={
        "queue_depth": {"r1": 10.0, "r2": 14.0}, "slo_pressure": {"r1": 0.2, "r2": 0.3}})
    assert slo_policy(ctx) == (3, {})
    assert slo_policy(SimpleNamespace(current_num_replicas=1, aggregated_metrics=None)) == (1, {})


class FakeHandle:
    """``handle.run.remote(call)``: fails with ``failures`` first (a replica that died), then answers ``reply``."""

    def __init__(self, failures: list[BaseException], reply: Reply) -> None:
        self.failures = failures
        self.reply = reply
        self.calls: list[Call] = []
        self.run = SimpleNamespace(remote=self._remote)

    def _remote(self, call: Call) -> Any:
        self.calls.append(call)

        async def answer() -> Reply:
            if self.failures:
                raise self.failures.pop(0)
            return self.reply

        return answer()


class Stages:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def stage_done(self, slo: str, stage: str, seconds: float, key_id: str = "") -> None:
        self.seen.append((slo, stage))


def _port(handle: FakeHandle, timeout_s: float = 30.0) -> ClusterExecutor:
    settings = Settings()
    settings.server.request_timeout_s = timeout_s
    return ClusterExecutor(Registry(settings), settings, handle=handle, observer=Stages())


def _died() -> BaseException:
    from ray.exceptions import ActorDiedError

    return ActorDiedError()


async def test_committed_work_is_sent_again_when_the_replica_dies() -> None:
    from lingua_fusion.serving.ports import AsrOutput

    handle = FakeHandle([_died(), _died()], Reply.ok(AsrOutput("hello", 0.9), depth=3))
    port = _port(handle)
    out = await port.run(ModelKey.asr("en"), AsrInput(np.zeros(16000, np.float32)), CallContext("st_1"))
    assert out == AsrOutput("hello", 0.9)
    assert len(handle.calls) == 3 and port.hop_retries == 2
    assert port.depth(ModelKey.asr("en")) == 3  # the replica's queue, from its reply
    assert port.observer.seen == [("standard", "asr")]  # type: ignore[union-attr]
    await port.close()


async def test_tentative_work_is_never_retried() -> None:
    handle = FakeHandle([_died()], Reply.ok("x", depth=0))
    port = _port(handle)
    with pytest.raises(BackendError):
        await port.run(ModelKey.mt("en", "es"), MtInput("hi"), CallContext("st_1", tentative=True))
    assert len(handle.calls) == 1
    await port.close()


async def test_a_committed_call_gives_up_at_the_request_timeout() -> None:
    handle = FakeHandle([_died() for _ in range(100)], Reply.ok("x", depth=0))
    port = _port(handle, timeout_s=0.6)
    with pytest.raises(ModelTimeout):
        await asyncio.wait_for(port.run(ModelKey.mt("en", "es"), MtInput("hi"), CallContext("st_1")), timeout=10)
    await port.close()


async def test_a_model_error_is_not_retried_by_the_gateway() -> None:
    handle = FakeHandle([], Reply.failed(Overloaded("the mt:en-es queue is full"), depth=256))
    port = _port(handle)
    with pytest.raises(Overloaded):
        await port.run(ModelKey.mt("en", "es"), MtInput("hi"), CallContext("st_1"))
    assert len(handle.calls) == 1  # the replica retried backend failures already; a full queue is an answer
    await port.close()


def test_the_cluster_stream_cap_counts_the_other_gateways() -> None:
    settings = Settings()
    settings.server.max_streams = 3
    port = ClusterExecutor(Registry(settings), settings, handle=FakeHandle([], Reply.ok(None, 0)))
    port.others = lambda: 3  # other gateways admitted 3
    demand = port.demand("st_1", "standard", "en", ["es"], False, 0.5, ["text"])
    with pytest.raises(Overloaded):
        port.admit(demand)
    port.others = lambda: 2
    port.admit(demand)
    assert "st_1" in port.local.scheduler.admitted and port.admitted == 1


async def test_a_model_replica_runs_a_call_on_its_executor_and_answers_errors_as_codes() -> None:
    from lingua_fusion.cluster.replica import ModelReplica

    replica = ModelReplica(Settings().model_dump(mode="json"), warm=())
    try:
        ok = await replica.run(Call.make(ModelKey.mt("en", "es"), MtInput("Good morning."), CallContext("st_1"), 0.0))
        assert ok.code is None and "buenos" in ok.result().lower()
        bad = await replica.run(Call.make(ModelKey.mt("en", "xx"), MtInput("Good morning."), CallContext("st_1"), 0.0))
        assert bad.code is not None  # a typed error, not an exception across the hop
        with pytest.raises(Exception) as err:
            bad.result()
        assert getattr(err.value, "code", None) == bad.code
        stats = replica.record_autoscaling_stats()
        assert stats["queue_depth"] == 0.0 and 0.0 <= stats["slo_pressure"]
    finally:
        await replica.close()
