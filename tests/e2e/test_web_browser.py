"""The web pages in a real browser: Debian's chromium, headless, driven by Selenium, against a real server with
real models and auth on.

- The captions page plays a real speech WAV (Piper) through its file input as a live stream: partials come before
  finals, the finals on the page are the ones the socket carried (in two target languages), the words are right,
  the downloaded SRT holds them; a video (a rendered slide + speech, VP8/Opus WebM) shows its slide beside the
  captions; the microphone (Chromium's fake device) streams PCM.
- The key is typed once, kept in sessionStorage, and never appears in a URL the page requests; the WebSocket opens
  with a single-use ticket.
- The operations page's numbers equal /metrics read right after (the page paused).
- Each page (captions, operations, /docs) runs under its Content-Security-Policy: no violation is reported while
  it works (a blocked script, worklet, socket or style would be one).

Screenshots are saved in the test's tmp dir and copied to build/screens/ (the run's artefacts, not tracked), or to
$LINGUAFUSION_SCREENS_DIR: the committed ones in bench/results/screens/ come from a run with it set there.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jiwer
import numpy as np
import pytest
from conftest import BIN, piper_wav, render_slide, start_server, stop_server
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from lingua_fusion.api.opsview import histogram_quantile

SCREENS = Path(os.environ.get("LINGUAFUSION_SCREENS_DIR")
               or Path(__file__).resolve().parents[2] / "build" / "screens")
PORT = 18210
SENTENCES = ["Good morning everyone.",  # a long second sentence: partials while it is spoken
             "Today we talk about the weather in the city and the river bank, which is green in the spring and "
             "brown in the autumn."]


@dataclass
class Site:
    url: str
    admin_key: str
    user_key: str
    state: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    state = tmp_path_factory.mktemp("web-state")

    def key(*args: str) -> str:
        return subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state), *args], capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()

    admin, user = key("--admin"), key()
    url, proc = start_server(state, port=PORT)
    yield Site(url, admin, user, state)
    stop_server(proc)


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Callable[[WebDriver, str], Path]:
    folder = tmp_path_factory.mktemp("screens")
    SCREENS.mkdir(parents=True, exist_ok=True)

    def shot(driver: WebDriver, name: str) -> Path:
        path = folder / f"{name}.png"
        driver.save_screenshot(str(path))
        shutil.copy(path, SCREENS / path.name)
        return path

    return shot


# recorded from before any of the page's scripts run (DevTools injects it, so the page's policy does not block it)
CSP_WATCH = ("window.__csp = []; document.addEventListener('securitypolicyviolation', "
             "e => window.__csp.push(`${e.effectiveDirective} ${e.blockedURI}`));")


def csp_violations(driver: WebDriver) -> list[str]:
    """What the page's Content-Security-Policy blocked since it loaded."""
    return list(driver.execute_script("return window.__csp || ['no watch']"))


def chromium(downloads: Path) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                "--autoplay-policy=no-user-gesture-required", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_WATCH})
    return driver


@pytest.fixture()
def browser(downloads: Path) -> Iterator[WebDriver]:
    driver = chromium(downloads)
    yield driver
    driver.quit()


def network(driver: WebDriver) -> list[dict[str, Any]]:
    """The DevTools network events the browser logged since the last call (requests, sockets, frames)."""
    out = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"].startswith("Network."):
            out.append(message)
    return out


def wait(driver: WebDriver, condition: Callable[[WebDriver], Any], timeout: float = 60, what: str = "") -> Any:
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)
    except TimeoutException:
        status = driver.find_element(By.ID, "status").text if driver.find_elements(By.ID, "status") else ""
        raise AssertionError(f"timed out waiting for {what}; page status: {status!r}") from None


def enter_key(driver: WebDriver, key: str) -> None:
    """The page's key dialog: typed once."""
    wait(driver, lambda d: d.find_element(By.ID, "key-dialog").get_attribute("open") is not None, 20, "the key dialog")
    driver.find_element(By.ID, "key-input").send_keys(key)
    driver.find_element(By.ID, "key-ok").click()


def choose_targets(driver: WebDriver, targets: list[str]) -> None:
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#targets input"), 20, "the served languages")
    for box in driver.find_elements(By.CSS_SELECTOR, "#targets input"):
        if box.is_selected() != (box.get_attribute("value") in targets):
            box.click()


def play_file(driver: WebDriver, site: Site, media: Path, targets: list[str], slo: str = "interactive",
              speak: bool = False, on_partial: Callable[[WebDriver], Any] | None = None) -> None:
    driver.get(site.url + "/")
    choose_targets(driver, targets)
    Select(driver.find_element(By.ID, "slo")).select_by_value(slo)
    if speak:
        driver.find_element(By.ID, "speak").click()
    driver.find_element(By.ID, "file-input").send_keys(str(media))
    driver.find_element(By.ID, "start").click()
    if not driver.execute_script("return sessionStorage.getItem('linguafusion.key')"):
        enter_key(driver, site.user_key)
    if on_partial is not None:  # e.g. a screenshot while a partial is on the page (none under heavy load: no shot)
        with contextlib.suppress(TimeoutException):
            WebDriverWait(driver, 30, poll_frequency=0.1).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, "#partial .src"))
            on_partial(driver)
    wait(driver, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") in ("closed", "error"), 120,
         "the stream to close")
    assert driver.find_element(By.ID, "status").get_attribute("data-state") == "closed", \
        driver.find_element(By.ID, "status").text


def sent_messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON messages the page's WebSocket sent, in order."""
    return [json.loads(e["params"]["response"]["payloadData"]) for e in events
            if e["method"] == "Network.webSocketFrameSent" and e["params"]["response"]["opcode"] == 1]


def received(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON events the page's WebSocket received, in order."""
    return [json.loads(e["params"]["response"]["payloadData"]) for e in events
            if e["method"] == "Network.webSocketFrameReceived" and e["params"]["response"]["opcode"] == 1]


# ---- media ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sentences (Piper), 0.8 s of silence after each."""
    from lingua_fusion.models.tts import to_wav

    parts = []
    for sentence in SENTENCES:
        pcm, rate = _pcm(piper_wav(sentence))
        parts += [pcm, np.zeros(int(0.8 * rate), dtype=np.int16)]
    path = tmp_path_factory.mktemp("media") / "talk.wav"
    path.write_bytes(to_wav(np.concatenate(parts), rate))
    return path


SLIDES = [(["Quarterly results", "Second quarter"], "Welcome to the quarterly results."),
          (["Revenue by region", "Europe and Asia"], "Revenue grew in every region.")]


def _pcm(wav: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(wav)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16), w.getframerate()


@pytest.fixture(scope="module")
def slide_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WebM (VP8 + Opus): two rendered slides, one sentence spoken over each (and a second of silence after)."""
    import av
    from PIL import Image

    path = tmp_path_factory.mktemp("media") / "slides.webm"
    out = av.open(str(path), mode="w", format="webm")
    video = out.add_stream("libvpx", rate=5)
    video.width, video.height, video.pix_fmt = 640, 360, "yuv420p"
    audio = out.add_stream("libopus", rate=48000)
    audio.layout = "mono"
    resampler = av.AudioResampler(format="s16", layout="mono", rate=48000)
    pts = 0
    for lines, sentence in SLIDES:
        pcm, rate = _pcm(piper_wav(sentence))
        pcm = np.concatenate([pcm, np.zeros(rate, dtype=np.int16)])
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for f in resampler.resample(frame):
            for packet in audio.encode(f):
                out.mux(packet)
        picture = np.asarray(Image.open(io.BytesIO(render_slide(lines, size=(640, 360)))).convert("RGB"))
        for _ in range(math.ceil(len(pcm) / rate * 5)):
            v = av.VideoFrame.from_ndarray(picture, format="rgb24")
            v.pts = pts
            pts += 1
            for packet in video.encode(v):
                out.mux(packet)
    for f in resampler.resample(None):
        for packet in audio.encode(f):
            out.mux(packet)
    for packet in [*audio.encode(None), *video.encode(None)]:
        out.mux(packet)
    out.close()
    return path


# ---- the captions page -----------------------------------------------------------------------------------------
@dataclass
class CaptionsRun:
    events: list[dict[str, Any]]  # DevTools network events of the whole run
    captions: list[dict[str, Any]]  # what the page shows: per final, its source text and translations
    srt: str
    session_key: str
    played: int  # speech events the page decoded and scheduled for playback
    notices: str
    copied: str  # the clipboard after Copy (export language: Spanish)
    csp: list[str]  # what the page's policy blocked in the whole run


@pytest.fixture(scope="module")
def captions_run(site: Site, speech_wav: Path, downloads: Path,
                 screens: Callable[[WebDriver, str], Path]) -> Iterator[CaptionsRun]:
    driver = chromium(downloads)
    try:
        # the batch class: its partials have a 30 s budget, so a loaded machine does not shed them all
        play_file(driver, site, speech_wav, ["es", "ca"], slo="batch", speak=True,
                  on_partial=lambda d: screens(d, "captions-partial"))
        events = network(driver)
        captions = driver.execute_script("""
            return [...document.querySelectorAll('#captions .final')].map(li => ({
              seq: Number(li.dataset.seq), source: li.querySelector('.src').textContent,
              tr: Object.fromEntries([...li.querySelectorAll('.tr')].map(
                p => [p.querySelector('.lang').textContent, p.textContent.slice(p.querySelector('.lang')
                      .textContent.length)]))}))""")
        screens(driver, "captions-file")
        Select(driver.find_element(By.ID, "export-lang")).select_by_value("es")
        driver.find_element(By.ID, "download-srt").click()
        srt_path = downloads / "captions-es.srt"
        wait(driver, lambda d: srt_path.exists() and srt_path.stat().st_size > 0, 20, "the SRT download")
        driver.execute_cdp_cmd("Browser.grantPermissions", {"origin": site.url, "permissions": [
            "clipboardReadWrite", "clipboardSanitizedWrite"]})
        driver.find_element(By.ID, "copy").click()
        wait(driver, lambda d: "copied" in d.find_element(By.ID, "notices").text, 10, "the copy")
        copied = driver.execute_async_script("navigator.clipboard.readText().then(arguments[0], "
                                             "e => arguments[0]('error: ' + e))")
        session_key = driver.execute_script("return sessionStorage.getItem('linguafusion.key')")
        spoken = int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-played") or 0)
        notices = driver.find_element(By.ID, "notices").text
        yield CaptionsRun(events, captions, srt_path.read_text(encoding="utf-8"), session_key, spoken, notices,
                          copied, csp_violations(driver))
    finally:
        driver.quit()


def test_a_file_played_as_a_live_stream_gives_partials_then_finals(captions_run: CaptionsRun) -> None:
    got = received(captions_run.events)
    kinds = [e["type"] for e in got]
    assert kinds[0] == "ready" and kinds[-1] == "closed", kinds
    finals = [e for e in got if e["type"] == "final"]
    assert finals, kinds
    last_final = len(kinds) - 1 - kinds[::-1].index("final")
    assert {"partial", "revision"} & set(kinds[:last_final]), f"no partial came before a final: {kinds}"
    # the page shows exactly the finals the socket carried, in order, with both targets
    assert [c["seq"] for c in captions_run.captions] == [f["seq"] for f in finals] == list(range(1, len(finals) + 1))
    for shown, final in zip(captions_run.captions, finals, strict=True):
        assert shown["source"] == final["source_text"]
        assert shown["tr"] == {"es": final["translations"]["es"], "ca": final["translations"]["ca"]}
        assert final["translations"]["es"] and final["translations"]["ca"]
    heard = " ".join(c["source"] for c in captions_run.captions)
    wer = jiwer.wer(_words(" ".join(SENTENCES)), _words(heard))
    assert wer <= 0.2, (wer, heard)


def test_starting_asks_for_the_key_first_and_no_request_is_refused(captions_run: CaptionsRun) -> None:
    """The key dialog comes before the first request that needs a key: the run (Start with no key in the tab,
    the key typed, the file played) had no 401 for the page's console or the ops page's error count."""
    statuses = [e["params"]["response"]["status"] for e in captions_run.events
                if e["method"] == "Network.responseReceived"]
    assert statuses and 401 not in statuses and 403 not in statuses, statuses


def test_the_captions_page_runs_under_its_content_security_policy(captions_run: CaptionsRun, site: Site) -> None:
    """The whole run (key dialog, file, worklet, socket, speech, SRT download, copy) broke no directive."""
    assert captions_run.csp == []
    policy = httpx.get(site.url + "/", timeout=10).headers["content-security-policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy


def test_the_api_docs_render_under_their_policy(site: Site, browser: WebDriver) -> None:
    """/docs: Swagger UI from this server, its one inline script allowed by its hash, the operations listed."""
    browser.get(site.url + "/docs")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) > 10, 30, "Swagger UI's operations")
    assert csp_violations(browser) == []
    # and the watch sees what the policy blocks: an inline script added to the page does not run
    ran = browser.execute_script("""document.body.append(Object.assign(document.createElement('script'),
                                      {textContent: 'window.__ran = true'})); return window.__ran === true""")
    assert not ran
    wait(browser, lambda d: csp_violations(d), 5, "the violation report")
    assert csp_violations(browser)[0].startswith("script-src"), csp_violations(browser)


def test_copy_puts_the_spanish_captions_on_the_clipboard(captions_run: CaptionsRun) -> None:
    finals = [e for e in received(captions_run.events) if e["type"] == "final"]
    assert captions_run.copied == "\n".join(f["translations"]["es"].strip() for f in finals if f["translations"]["es"])


def test_translations_are_spoken_when_asked(captions_run: CaptionsRun) -> None:
    got = received(captions_run.events)
    speech = [e for e in got if e["type"] == "speech"]
    finals = [e for e in got if e["type"] == "final" and e["text"]]
    first_target = got[0]["targets"][0]  # the stream speaks its first target
    assert [s["seq"] for s in speech] == [f["seq"] for f in finals] and {s["lang"] for s in speech} == {first_target}
    assert captions_run.played == len(speech), captions_run.notices  # each one decoded and played


def test_the_downloaded_srt_holds_the_spanish_captions(captions_run: CaptionsRun) -> None:
    cues = [block.split("\n") for block in captions_run.srt.strip().split("\n\n")]
    finals = [e for e in received(captions_run.events) if e["type"] == "final"]
    assert [int(c[0]) for c in cues] == list(range(1, len(finals) + 1))
    for cue, final in zip(cues, finals, strict=True):
        start, end = cue[1].split(" --> ")
        assert _seconds(start) == pytest.approx(final["start"], abs=0.001)
        assert _seconds(end) == pytest.approx(final["end"], abs=0.001)
        assert "\n".join(cue[2:]) == final["translations"]["es"].strip()


def test_the_key_never_goes_in_a_url_and_the_socket_uses_a_ticket(captions_run: CaptionsRun, site: Site) -> None:
    assert captions_run.session_key == site.user_key  # typed once, kept in the tab
    urls = [e["params"]["request"]["url"] for e in captions_run.events if e["method"] == "Network.requestWillBeSent"]
    sockets = [e["params"]["url"] for e in captions_run.events if e["method"] == "Network.webSocketCreated"]
    assert any(u.endswith("/v1/stream-tickets") for u in urls)
    assert len(sockets) == 1 and "/v1/streams?ticket=wst_" in sockets[0]
    for url in urls + sockets:
        assert site.user_key not in url and "api_key" not in url, url
    tickets = [e for e in captions_run.events if e["method"] == "Network.requestWillBeSent"
               and e["params"]["request"]["url"].endswith("/v1/stream-tickets")]
    assert tickets[-1]["params"]["request"]["headers"].get("Authorization") == f"Bearer {site.user_key}"


def test_a_video_shows_its_slides_translated_beside_the_captions(site: Site, slide_video: Path,
                                                                browser: WebDriver,
                                                                screens: Callable[[WebDriver, str], Path]) -> None:
    play_file(browser, site, slide_video, ["es"], slo="standard")
    events = network(browser)
    sent = sent_messages(events)
    assert sent[0]["inputs"] == ["audio", "video"] and sum(m["type"] == "frame" for m in sent) >= 8
    got = received(events)
    slides = [e for e in got if e["type"] == "slide"]
    # one slide event per slide shown: the server finds the changes in the frames the page sends
    assert [s["source_text"].split()[:2] for s in slides] == [lines[0].split()[:2] for lines, _ in SLIDES], \
        [(e["type"], e.get("message") or e.get("source_text")) for e in got]
    panel = list(reversed(browser.find_elements(By.CSS_SELECTOR, "#slides .slide")))  # newest first on the page
    assert len(panel) == len(slides)
    for item, slide in zip(panel, slides, strict=True):
        assert item.find_element(By.CSS_SELECTOR, ".src").text == slide["source_text"].strip()
        shown = item.find_element(By.CSS_SELECTOR, ".tr").text
        assert slide["translations"]["es"] and shown.endswith(slide["translations"]["es"].strip().split("\n")[-1])
        assert item.find_element(By.TAG_NAME, "img").get_attribute("src").startswith("data:image/jpeg")
    captions = " ".join(li.text for li in browser.find_elements(By.CSS_SELECTOR, "#captions .final .src"))
    assert jiwer.wer(_words(" ".join(s for _, s in SLIDES)), _words(captions)) <= 0.2, captions
    screens(browser, "captions-video")


def test_the_microphone_streams_pcm_until_stopped(site: Site, browser: WebDriver) -> None:
    browser.get(site.url + "/")
    browser.execute_script("sessionStorage.setItem('linguafusion.key', arguments[0])", site.user_key)
    browser.get(site.url + "/")
    choose_targets(browser, ["es"])
    browser.find_element(By.CSS_SELECTOR, "input[name=input][value=mic]").click()
    browser.find_element(By.ID, "start").click()
    wait(browser, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") == "live", 30, "live")
    audio: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(audio) < 10:  # one second of audio
        audio += [m for m in sent_messages(network(browser)) if m["type"] == "audio"]
        time.sleep(0.2)
    pcm = [base64.b64decode(m["data"]) for m in audio]
    assert len(pcm) >= 10 and all(len(p) == 3200 for p in pcm)  # 100 ms of PCM16 16 kHz each
    assert [m["ts"] for m in audio] == pytest.approx([i * 0.1 for i in range(len(audio))])  # on the media clock
    browser.find_element(By.ID, "stop").click()
    wait(browser, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") == "closed", 30, "closed")
    assert csp_violations(browser) == []  # the worklet and the microphone's socket are allowed


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_the_page_resumes_its_stream_across_a_server_restart(how: str, tmp_path: Path, speech_wav: Path,
                                                             downloads: Path,
                                                             screens: Callable[[WebDriver, str], Path]) -> None:
    """The server SIGKILLed (the socket drops) or SIGTERMed (it drains: close 1012) while a file plays, a new one
    started on the same state: the page reconnects with a new ticket, resumes, re-sends the audio the server had
    not committed, and shows every final exactly once."""
    state = tmp_path / "state"
    state.mkdir()
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    url, proc = start_server(state, port=PORT + 20)
    driver = chromium(downloads)
    try:
        driver.get(url + "/")
        driver.execute_script("sessionStorage.setItem('linguafusion.key', arguments[0])", key)
        driver.get(url + "/")
        choose_targets(driver, ["es"])
        Select(driver.find_element(By.ID, "slo")).select_by_value("standard")
        driver.find_element(By.ID, "file-input").send_keys(str(speech_wav))
        driver.find_element(By.ID, "start").click()
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#captions .final"), 60, "a first final")
        if how == "sigkill":
            proc.kill()  # a crash: the socket drops (1006), the stream log keeps what was committed
            proc.wait(timeout=30)
        else:
            stop_server(proc)  # drains: committed work is logged and sent, then close 1012
        wait(driver, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") == "reconnecting", 30,
             "the page to notice")
        url, proc = start_server(state, port=PORT + 20)
        wait(driver, lambda d: d.find_element(By.ID, "status").get_attribute("data-state") in ("closed", "error"),
             120, "the resumed stream to close")
        assert driver.find_element(By.ID, "status").get_attribute("data-state") == "closed"
        events = network(driver)
        got = received(events)
        readies = [e for e in got if e["type"] == "ready"]
        assert len(readies) >= 2 and readies[-1].get("resumed") is True
        shown = [int(li.get_attribute("data-seq")) for li in driver.find_elements(By.CSS_SELECTOR,
                                                                                  "#captions .final")]
        closed = [e for e in got if e["type"] == "closed"][-1]
        assert shown == list(range(1, closed["finals"] + 1))  # every final once, in order, none missing
        heard = " ".join(li.text for li in driver.find_elements(By.CSS_SELECTOR, "#captions .final .src"))
        assert jiwer.wer(_words(" ".join(SENTENCES)), _words(heard)) <= 0.25, heard
        screens(driver, f"captions-resumed-{how}")
    finally:
        driver.quit()
        stop_server(proc)


# ---- tickets -----------------------------------------------------------------------------------------------------
def test_a_stream_ticket_opens_one_stream_once(site: Site) -> None:
    import asyncio

    import websockets

    r = httpx.post(site.url + "/v1/stream-tickets", headers={"X-API-Key": site.user_key}, timeout=10)
    assert r.status_code == 201 and r.json()["expires_in"] == 60
    ticket = r.json()["ticket"]
    ws_url = site.url.replace("http", "ws") + "/v1/streams?ticket=" + ticket

    async def first_event(url: str) -> tuple[dict[str, Any], int | None]:
        async with websockets.connect(url, open_timeout=10) as ws:
            await ws.send(json.dumps({"type": "start", "target_langs": ["es"], "inputs": ["text"]}))
            event = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if event["type"] == "ready":
                await ws.send(json.dumps({"type": "end"}))
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            except websockets.ConnectionClosed as closed:
                return event, closed.rcvd.code if closed.rcvd else None

    event, code = asyncio.run(first_event(ws_url))
    assert event["type"] == "ready" and code == 1000
    again, code = asyncio.run(first_event(ws_url))  # the same ticket a second time
    assert again["type"] == "error" and again["code"] == "unauthenticated" and code == 4401
    key_as_ticket, code = asyncio.run(first_event(ws_url.split("?")[0] + "?ticket=" + site.user_key))
    assert key_as_ticket["code"] == "unauthenticated" and code == 4401  # ?ticket= carries tickets, never keys


def test_a_ticket_of_a_key_revoked_since_is_refused(site: Site) -> None:
    import asyncio

    import websockets

    made = httpx.post(site.url + "/v1/keys", json={"name": "soon revoked"}, timeout=10,
                      headers={"Authorization": f"Bearer {site.admin_key}"}).json()
    ticket = httpx.post(site.url + "/v1/stream-tickets", headers={"X-API-Key": made["api_key"]}, timeout=10
                        ).json()["ticket"]
    subprocess.run([str(BIN), "keys", "revoke", made["key_id"], "--state-dir", str(site.state)], check=True,
                   capture_output=True, timeout=60)  # straight in the key store: the server is not told

    async def first_event() -> dict[str, Any]:
        async with websockets.connect(site.url.replace("http", "ws") + "/v1/streams?ticket=" + ticket) as ws:
            await ws.send(json.dumps({"type": "start", "target_langs": ["es"], "inputs": ["text"]}))
            return dict(json.loads(await asyncio.wait_for(ws.recv(), 10)))

    event = asyncio.run(first_event())
    assert event["type"] == "error" and event["code"] == "unauthenticated" and "revoked" in event["message"]


def test_tickets_need_a_key_and_are_bounded_per_key(site: Site) -> None:
    r = httpx.post(site.url + "/v1/stream-tickets", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(site.state)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    codes = [httpx.post(site.url + "/v1/stream-tickets", headers={"Authorization": f"Bearer {key}"},
                        timeout=10).status_code for _ in range(9)]
    assert codes == [201] * 8 + [429]  # unused tickets per key are bounded
    other = httpx.post(site.url + "/v1/stream-tickets", headers={"Authorization": f"Bearer {site.user_key}"},
                       timeout=10)
    assert other.status_code == 201  # another key is not affected


# ---- the operations page -----------------------------------------------------------------------------------------
def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def snapshots(driver: WebDriver) -> int:
    return int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-snapshots") or 0)


def test_the_ops_page_numbers_equal_metrics(site: Site, speech_wav: Path, browser: WebDriver,
                                            screens: Callable[[WebDriver, str], Path]) -> None:
    assert httpx.get(site.url + "/v1/ops/metrics", timeout=10).status_code == 401
    assert httpx.get(site.url + "/v1/ops/metrics", headers={"X-API-Key": site.user_key}, timeout=10
                     ).status_code == 403  # a translate key cannot read it
    browser.get(site.url + "/ops")
    enter_key(browser, site.admin_key)
    wait(browser, lambda d: snapshots(d) >= 2, 30, "two snapshots")
    # a live stream while the page watches: its stages appear on the charts over time
    run = subprocess.run([str(BIN), "stream", str(speech_wav), "--to", "es", "--from", "en", "--slo", "standard",
                          "--realtime", "--json", "--url", site.url, "--api-key", site.user_key], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = snapshots(browser)
    wait(browser, lambda d: snapshots(d) >= seen + 2, 30, "two more snapshots")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-stages path")  # p50 / p99 lines over time
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-queues path")
    browser.find_element(By.ID, "pause").click()  # from here the page shows nothing new (a poll still out is dropped)
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-paused") == "true"
    shown = browser.execute_script("""
        return [...document.querySelectorAll('[data-metric],[data-histogram]')].map(n => ({
          metric: n.dataset.metric || null, histogram: n.dataset.histogram || null,
          labels: JSON.parse(n.dataset.labels || '{}'), quantile: n.dataset.quantile || null,
          value: n.dataset.value, text: n.textContent}))""")
    metrics = scrape(httpx.get(site.url + "/metrics", headers={"Authorization": f"Bearer {site.admin_key}"},
                               timeout=10).text)
    assert csp_violations(browser) == []
    browser.set_window_size(1400, 1500)
    screens(browser, "ops")
    assert len(shown) >= 20
    checked = set()
    for cell in shown:
        labels = tuple(sorted(cell["labels"].items()))
        if cell["metric"]:
            want = metrics[(cell["metric"], labels)]
            if cell["metric"] == "process_resident_memory_bytes":  # the process's memory moves between two reads
                assert float(cell["value"]) == pytest.approx(want, rel=0.05)
            else:
                assert float(cell["value"]) == want, cell
        else:
            buckets = [(float(dict(k[1])["le"]), v) for k, v in metrics.items() if k[0] == cell["histogram"] +
                       "_bucket" and tuple(p for p in k[1] if p[0] != "le") == labels]
            want_q = histogram_quantile(float(cell["quantile"]), buckets)
            assert (cell["value"] == "" and want_q is None) or math.isclose(float(cell["value"]), want_q or 0.0,
                                                                            rel_tol=1e-9), cell
        checked.add(cell["metric"] or cell["histogram"])
    assert {"linguafusion_active_streams", "linguafusion_streams_admitted_total",
            "linguafusion_streams_rejected_total", "linguafusion_streams_unavailable_total",
            "process_resident_memory_bytes", "linguafusion_stage_latency_seconds", "linguafusion_batch_size",
            "linguafusion_queue_depth"} <= checked
    assert metrics[("linguafusion_streams_admitted_total", ())] >= 1  # the captions run was counted


def _words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


def _seconds(stamp: str) -> float:
    hms, ms = stamp.split(",")
    h, m, s = (int(x) for x in hms.split(":"))
    return h * 3600 + m * 60 + s + int(ms) / 1000
