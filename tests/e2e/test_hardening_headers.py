"""Issue 29, against a real server with auth on (`linguafusion serve`, a scrape token set): the security headers of
every page and every other response, no inline script the page's policy does not name by its hash, who may read
/metrics, and a room route given JSON that is not strict JSON. A keyless server's /metrics stays open."""

from __future__ import annotations

import base64
import hashlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from conftest import BIN, start_server, stop_server

TOKEN = "mt_Qm9vZ2l0eS1zY3JhcGUtdG9rZW4tMjA"  # the scrape token (server.metrics_token): fixed, so that every
# xdist worker collects the same parametrized near misses (a random one made each collect different tests)
PAGES = ["/", "/ops", "/docs"]


@dataclass
class Site:
    url: str
    admin: str
    user: str
    state: Path

    def get(self, path: str, secret: str | None = None, **kw: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
        return httpx.get(self.url + path, headers=headers, timeout=30, **kw)  # type: ignore[arg-type]

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.state.glob("server-*.log"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    state = tmp_path_factory.mktemp("h29-state")

    def key(*args: str) -> str:
        return subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state), *args], capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()

    admin, user = key("--admin"), key()
    url, proc = start_server(state, env={"LINGUAFUSION_SERVER__METRICS_TOKEN": TOKEN})
    yield Site(url, admin, user, state)
    stop_server(proc)


def directives(policy: str) -> dict[str, list[str]]:
    """A Content-Security-Policy header as {directive: sources}."""
    out: dict[str, list[str]] = {}
    for part in policy.split(";"):
        name, *sources = part.split()
        out[name] = sources
    return out


class Scripts(HTMLParser):
    """A page's scripts: the inline ones' exact text, the external ones' src, and any inline event handler."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.inline: list[str] = []
        self.external: list[str] = []
        self.handlers: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handlers += [f"{tag} {name}" for name, _ in attrs if name.startswith("on")]
        self.handlers += [f"{tag} {name}" for name, v in attrs if (v or "").strip().lower().startswith("javascript:")]
        if tag == "script":
            src = dict(attrs).get("src")
            if src is not None:
                self.external.append(src)
            else:
                self._open = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._open is not None:
            self.inline.append("".join(self._open))
            self._open = None


def sha256_source(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode() + "'"


# ---- security headers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PAGES)
def test_each_page_has_a_policy_without_inline_script_and_cannot_be_framed(site: Site, path: str) -> None:
    r = site.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text[:300]
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    csp = directives(r.headers["content-security-policy"])
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["object-src"] == ["'none'"] and csp["base-uri"] == ["'none'"]
    script_src = csp["script-src"]
    assert script_src[0] == "'self'"
    assert not {"'unsafe-inline'", "'unsafe-eval'", "*", "data:", "blob:"} & set(script_src)
    assert all(s.startswith("'sha256-") for s in script_src[1:]), script_src
    for name, sources in csp.items():  # nothing from another origin: /docs's Swagger UI is this server's too
        assert all(s.startswith("'") or s in ("data:", "blob:") for s in sources), (name, sources)


@pytest.mark.parametrize("path", PAGES)
def test_no_inline_script_runs_without_its_hash_in_the_policy(site: Site, path: str) -> None:
    r = site.get(path)
    page = Scripts()
    page.feed(r.text)
    script_src = directives(r.headers["content-security-policy"])["script-src"]
    assert [sha256_source(s) for s in page.inline] == script_src[1:]  # each inline script named, nothing more
    assert page.handlers == []  # onclick= and javascript: URLs would be inline script the policy blocks
    for src in page.external:  # this server's files, each served as JavaScript with nosniff
        assert src.startswith("/") and not src.startswith("//"), src
        js = site.get(src)
        assert js.status_code == 200 and "javascript" in js.headers["content-type"], (src, js.status_code)
        assert js.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(("path", "secret", "status"), [
    ("/healthz", None, 200), ("/v1/models", None, 200), ("/openapi.json", None, 200),
    ("/static/style.css", None, 200), ("/v1/ops/metrics", None, 401), ("/v1/glossaries", "user", 200),
    ("/nope", None, 404), ("/metrics", "admin", 200)])
def test_every_other_response_has_the_headers_and_a_policy_that_loads_nothing(site: Site, path: str,
                                                                             secret: str | None,
                                                                             status: int) -> None:
    r = site.get(path, {"user": site.user, "admin": site.admin}.get(secret or ""))
    assert r.status_code == status, r.text[:300]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert directives(r.headers["content-security-policy"]) == {"default-src": ["'none'"],
                                                                "frame-ancestors": ["'none'"]}


def test_a_body_over_the_limit_refused_by_the_guard_has_the_headers_too(site: Site) -> None:
    r = httpx.post(site.url + "/v1/keys", content=b"{" + b" " * (1 << 20) + b"}", timeout=30,
                   headers={"Authorization": f"Bearer {site.admin}", "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"


# ---- /metrics ------------------------------------------------------------------------------------------------
def near_misses(token: str) -> list[str]:
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    return [token[:-1], flipped, token + "x", token[:8], " " + token.upper(), "x" + token[1:]]


@pytest.mark.parametrize(("who", "status", "code"), [
    (None, 401, "unauthenticated"), ("user", 403, "forbidden"),
    ("sk_not_a_key", 401, "unauthenticated")] + [(miss, 401, "unauthenticated") for miss in near_misses(TOKEN)])
def test_metrics_refuses_without_an_admin_key_or_the_token(site: Site, who: str | None, status: int,
                                                           code: str) -> None:
    secret = site.user if who == "user" else who
    r = site.get("/metrics", secret)
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == code and "message" in error
    assert "linguafusion_" not in r.text  # no figure leaks in the refusal
    ops = site.get("/v1/ops/metrics", secret)  # refused the same way as the JSON view
    assert (ops.status_code, ops.json()["error"]["code"]) == (status, code)


@pytest.mark.parametrize("how", ["admin key", "token", "token as X-API-Key"])
def test_metrics_answers_an_admin_key_and_the_scrape_token(site: Site, how: str) -> None:
    if how == "token as X-API-Key":
        r = httpx.get(site.url + "/metrics", headers={"X-API-Key": TOKEN}, timeout=30)
    else:
        r = site.get("/metrics", site.admin if how == "admin key" else TOKEN)
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"].startswith("text/plain") and "linguafusion_requests_total" in r.text


def test_the_token_is_no_api_key(site: Site) -> None:
    """The scrape token reads /metrics only: the JSON view and every other route still want a key."""
    assert site.get("/v1/ops/metrics", TOKEN).status_code == 401
    assert site.get("/v1/keys", TOKEN).status_code == 401
    no_scheme = httpx.get(site.url + "/metrics", headers={"Authorization": TOKEN}, timeout=30)  # not "Bearer ..."
    assert no_scheme.status_code == 401
    assert TOKEN not in site.log()


def test_metrics_is_open_on_a_keyless_server(tmp_path: Path) -> None:
    url, proc = start_server(tmp_path, "--no-auth")
    try:
        r = httpx.get(url + "/metrics", timeout=30)
        assert r.status_code == 200 and "linguafusion_requests_total" in r.text
    finally:
        stop_server(proc)


# ---- strict JSON on the room routes --------------------------------------------------------------------------
@pytest.mark.parametrize("body", [b'{"source_lang": "\\ud800"}', b'{"source_lang": "en", "x": "\\udfff"}',
                                  b'{"source_lang": NaN}', b'{"\\ud83d": 1}'])
def test_a_room_body_that_is_not_strict_json_is_a_typed_400(site: Site, body: bytes) -> None:
    r = httpx.post(site.url + "/v1/rooms", content=body, timeout=30,
                   headers={"Authorization": f"Bearer {site.user}", "Content-Type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_parameter"
    assert "not valid JSON" in r.json()["error"]["message"]


def test_a_room_body_with_a_surrogate_pair_is_served(site: Site) -> None:
    """A pair (one character, U+1F600) is text: it reaches the route, which says what is wrong with the field."""
    h = {"Authorization": f"Bearer {site.user}", "Content-Type": "application/json"}
    r = httpx.post(site.url + "/v1/rooms", content=b'{"source_lang": "en", "note": "\\ud83d\\ude00"}', headers=h,
                   timeout=30)
    assert r.status_code == 201, r.text[:300]
    assert "Traceback" not in site.log()
