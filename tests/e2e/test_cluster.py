"""The cluster on Ray Serve (docs/cluster.md), on a real Ray cluster of two nodes on loopback and a real Redis:
`linguafusion serve --cluster` with two gateway replicas behind Serve's proxy and one model replica, auth on (the
admin key made by `keys create --admin` in Redis, a user's key minted through the proxy), each node's replicas in
their own state directory (cluster/node.py).

- the two nodes keep separate state directories, and no key, glossary or stream log is in any of them;

- a gateway SIGKILLed mid-stream: the client reconnects through the proxy, lands on another gateway process and
  resumes there; every committed caption exactly once, the whole recording covered;
- the model replica SIGKILLed mid-stream: Serve starts another, the committed work sent meanwhile is retried,
  every caption arrives, none failed, on the same connection;
- a room published through one gateway is heard by a listener connected to the other one (the rooms' Redis bus),
  every final once, also when the publisher's gateway is killed mid-room and the publisher resumes elsewhere;
- SIGTERM to `serve --cluster` drains every gateway before Serve stops: a live stream gets its captions, then the
  close that tells it to reconnect (1012). It stops the cluster, so it runs last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jiwer
import pytest
from conftest import BIN, REDIS, needs_redis, talk_wav

from lingua_fusion.cluster.heartbeat import Beat
from lingua_fusion.cluster.local import LocalRay, alive, kill_when_busy, live_gateways, replica_pids

pytestmark = needs_redis
SERVE_PORT = 18718
SENTENCES = ["Good morning everyone and welcome to the quarterly review.", "The new office will open in the spring.",
             "Please send me the report before Friday.", "We need more time to finish the project.",
             "The train to the airport leaves every hour.", "Thank you all for your hard work."]
SHORT = SENTENCES[:4]  # the talk the gateway and room tests stream (14 s)
NORM = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.Strip()])


@dataclass
class Cluster:
    url: str
    key: str  # a user's key, minted through the proxy with the admin key
    state: Path  # the driver's --state-dir
    talk: Path
    long_talk: Path  # the same sentences with short pauses: utterances up to 10 s, so a batch runs long enough
    slow_talk: Path  # the short talk with long pauses (about a minute): a room that outlasts placing its listener
    driver: subprocess.Popen[bytes]  # to be killed in the middle of it

    def beats(self) -> list[Beat]:
        return live_gateways(REDIS or "", f"127.0.0.1:{SERVE_PORT}")


def _wait(cond: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cluster")
    talk = tmp / "talk.wav"
    talk.write_bytes(talk_wav(SHORT))
    long_talk = tmp / "long_talk.wav"
    long_talk.write_bytes(talk_wav(SENTENCES, pause_s=0.15))
    slow_talk = tmp / "slow_talk.wav"
    slow_talk.write_bytes(talk_wav(SHORT, pause_s=12))
    ray = LocalRay(nodes=2, cpus_per_node=1)
    ray.stop()  # a cluster left by an interrupted run holds the ports
    ray.start()
    log = open(tmp / "driver.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, "LINGUAFUSION_STATE__REDIS_URL": REDIS or "", "RAY_USAGE_STATS_ENABLED": "0"}
    state = tmp / "state"
    admin = subprocess.run([str(BIN), "keys", "create", "--admin", "--state-dir", str(state)], env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    driver = subprocess.Popen([str(BIN), "serve", "--cluster", "--ray-address", ray.address, "--port",
                               str(SERVE_PORT), "--state-dir", str(state), "--gateways", "2",
                               "--model-replicas", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    c = Cluster(f"http://127.0.0.1:{SERVE_PORT}", "", state, talk, long_talk, slow_talk, driver)
    try:
        def ready() -> bool:
            assert driver.poll() is None, (tmp / "driver.log").read_text()
            try:
                ok = httpx.get(c.url + "/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False
            return ok and len(c.beats()) == 2

        _wait(ready, 150, "two gateways and a model replica")
        r = httpx.post(c.url + "/v1/keys", json={"name": "cluster-user"}, timeout=30,
                       headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 201, r.text
        c.key = r.json()["api_key"]
        yield c
    finally:
        driver.send_signal(signal.SIGTERM)  # the driver shuts Serve down
        try:
            driver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            driver.kill()
        log.close()
        ray.stop()


class Stream:
    """`linguafusion stream FILE --to es --realtime --json` against the cluster, read as it goes."""

    def __init__(self, c: Cluster, *extra: str, long: bool = False, slow: bool = False) -> None:
        self.sentences = SENTENCES if long else SHORT
        talk = c.long_talk if long else c.slow_talk if slow else c.talk
        self.proc = subprocess.Popen([str(BIN), "stream", str(talk), "--to", "es", "--realtime", "--json",
                                      "--url", c.url, "--api-key", c.key, "--no-partials", *extra],
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.events: list[dict[str, Any]] = []
        self.first_final = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            ev = json.loads(line)
            self.events.append(ev)
            if ev.get("type") == "final":
                self.first_final.set()

    def finish(self) -> tuple[list[dict[str, Any]], str]:
        try:
            self.proc.wait(timeout=150)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(timeout=10)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        assert self.proc.returncode == 0, err
        return self.events, err


def _check_captions(events: list[dict[str, Any]], sentences: list[str]) -> list[dict[str, Any]]:
    finals = [e for e in events if e["type"] == "final"]
    assert [f["seq"] for f in finals] == list(range(1, len(finals) + 1))  # none lost, none repeated
    assert not [f for f in finals if f.get("failed")]  # no stage gave up
    spoken = " ".join(f["source_text"] for f in finals)
    assert jiwer.wer(NORM(" ".join(sentences)), NORM(spoken)) <= 0.2, spoken  # the whole recording is covered
    assert events[-1]["type"] == "closed"
    return finals


def _holder(c: Cluster) -> Beat:
    """The gateway holding the one live stream."""
    return _wait(lambda: next((b for b in c.beats() if b.streams), None), 20, "the stream's gateway")


def test_each_node_keeps_its_own_state_directory_and_no_user_state_is_on_disk(cluster: Cluster) -> None:
    """Keys, glossaries and the stream log are in Redis: a key the proxy refuses without it works with it on every
    gateway, and the state directories (one per Ray node, under the driver's --state-dir) hold none of them."""
    anon = httpx.post(cluster.url + "/v1/translate", data={"text": "Hello.", "target_lang": "es"}, timeout=30)
    assert anon.status_code == 401
    beats = cluster.beats()
    assert len({b.state_dir for b in beats}) == len({b.node for b in beats}) and all(b.node for b in beats)
    nodes = sorted(p.name for p in (cluster.state / "nodes").iterdir())
    assert set(nodes) >= {b.node for b in beats} and len(nodes) == 2  # the gateways' and the model replica's nodes
    for b in beats:
        assert Path(b.state_dir) == cluster.state / "nodes" / b.node
    stored = {p.name for p in cluster.state.rglob("*") if p.is_file()}
    assert not {n for n in stored if n.endswith((".sqlite3", ".db"))}, stored  # no key store, no stream log


def test_a_file_request_runs_on_the_model_replicas_through_the_gateways_engine(cluster: Cluster) -> None:
    """A file's model work goes through the gateway's engine (files/engine.py), which sends ASR and MT to the model
    replicas as it does streams' (cluster/port.py): the talk comes back transcribed and translated."""
    r = httpx.post(cluster.url + "/v1/translate", files={"file": ("talk.wav", cluster.talk.read_bytes(), "audio/wav")},
                   data={"target_lang": "es", "source_lang": "en"}, timeout=180,
                   headers={"Authorization": f"Bearer {cluster.key}"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "oficina" in body["text"].lower() and len(body["segments"]) >= 2, body["text"]
    assert body["models"]["asr"].startswith("whisper-tiny.en")


def test_a_gateway_killed_mid_stream_the_client_resumes_on_another(cluster: Cluster) -> None:
    s = Stream(cluster)
    assert s.first_final.wait(90), "no caption before the kill"
    victim = _holder(cluster)
    os.kill(victim.pid, signal.SIGKILL)
    # the client reconnects through the proxy; the stream goes on in another gateway process
    moved = _wait(lambda: next((b for b in cluster.beats() if b.streams and b.pid != victim.pid), None), 60,
                  "the stream on another gateway")
    assert moved.streams == victim.streams  # the same stream id, resumed
    events, err = s.finish()
    _check_captions(events, s.sentences)
    assert "reconnected" in err


def test_the_model_replica_killed_mid_stream_is_restarted_and_nothing_is_lost(cluster: Cluster) -> None:
    name = "ServeReplica:lf-models:ModelReplica"
    (old,) = replica_pids(name)
    s = Stream(cluster, long=True)
    assert s.first_final.wait(90), "no caption before the kill"
    holder = _holder(cluster)
    kill_when_busy(old)  # while it runs a batch: that committed work is lost with it and must be sent again
    new = _wait(lambda: [p for p in replica_pids(name) if p != old], 90, "Serve to start another model replica")
    assert len(new) == 1
    events, err = s.finish()
    finals = _check_captions(events, s.sentences)
    assert "reconnected" not in err  # the gateway kept the connection: only the model work moved
    assert len(finals) >= 2
    assert alive(holder.pid)  # the gateway was not touched
    retried = next(b for b in cluster.beats() if b.pid == holder.pid).hop_retries
    assert retried >= 1  # the call the replica died with was sent again


def test_a_listener_on_one_gateway_hears_a_room_published_on_the_other_through_its_gateways_death(
        cluster: Cluster) -> None:
    # the slow talk: a listener's CLI may take half a minute to start on 2 busy cores, and one that lands on the
    # publisher's gateway starts again; the 14 s talk once ended the room before a listener was placed (CI)
    pub = Stream(cluster, "--room", slow=True)
    ready = _wait(lambda: next((e for e in pub.events if e.get("type") == "ready"), None), 60, "the room's ready")
    room, token = ready["room_id"], ready["listener_token"]
    publisher = _holder(cluster)
    listener: subprocess.Popen[str] | None = None
    for _ in range(6):  # Serve's proxy picks the gateway; a listener that lands on the publisher's is tried again
        listener = subprocess.Popen([str(BIN), "listen", room, "--token", token, "--to", "es", "--json", "--url",
                                     cluster.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # a gateway's beat names its listeners: the CLI's start and a beat's interval, on 2 busy cores (a CI run
        # once took over 30 s); a listener that ended says why
        where = _wait(lambda p=listener: [b for b in cluster.beats() if b.listeners] or p.poll() is not None, 60,
                      "the listener's gateway")
        assert listener.poll() is None, listener.communicate(timeout=10)
        if where[0].pid != publisher.pid:
            break
        listener.kill()
        listener.wait(timeout=10)
        _wait(lambda: not [b for b in cluster.beats() if b.listeners], 30, "the listener to leave")
    else:
        pytest.fail("every listener landed on the publisher's gateway")
    assert listener is not None
    # the publisher's gateway dies mid-room: the publisher resumes on another gateway and the room goes on
    assert pub.first_final.wait(90), "no caption before the kill"
    os.kill(publisher.pid, signal.SIGKILL)
    events, err = pub.finish()
    assert "reconnected" in err
    published = _check_captions(events, pub.sentences)
    out, err = listener.communicate(timeout=60)
    assert listener.returncode == 0, err
    heard = [json.loads(line) for line in out.splitlines() if line.strip()]
    heard_finals = [e for e in heard if e["type"] == "final"]
    assert [f["seq"] for f in heard_finals] == [f["seq"] for f in published]  # a late joiner gets 1..N once
    assert [f["translations"]["es"] for f in heard_finals] == [f["translations"]["es"] for f in published]


async def test_sigterm_drains_every_gateway_then_stops_the_cluster(cluster: Cluster) -> None:
    import asyncio
    import contextlib

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    got: list[dict[str, Any]] = []
    async with connect(f"ws://127.0.0.1:{SERVE_PORT}/v1/streams", open_timeout=30,
                       additional_headers={"Authorization": f"Bearer {cluster.key}"}) as ws:
        await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "inputs": ["text"],
                                  "partials": False}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "ready"
        for i, text in enumerate(SHORT):
            await ws.send(json.dumps({"type": "text", "text": text, "ts": float(i)}))
        cluster.driver.send_signal(signal.SIGTERM)
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(60):
                async for raw in ws:  # until the server closes the socket
                    got.append(json.loads(raw))
        code = ws.close_code
    assert code == 1012  # draining: reconnect (here the cluster is going away; a restarted one would resume it)
    finals = [e for e in got if e["type"] == "final"]
    assert [f["seq"] for f in finals] == [1, 2, 3, 4]  # what was sent was translated and sent before the close
    assert await asyncio.to_thread(cluster.driver.wait, 60) == 0
