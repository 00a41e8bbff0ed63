"""What the REST routes share: the app context, auth (a FastAPI dependency), form reading within limits."""

from __future__ import annotations

import hmac
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from starlette.applications import Starlette
from starlette.datastructures import FormData, State
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect
from starlette.routing import Mount, Route, WebSocketRoute

from .. import strict_json
from ..config import Settings
from ..errors import AuthenticationError, InvalidParameter, TooLarge, UnsupportedContentType
from ..files import FileTranslator
from ..json_bounds import JsonBounds, bounds_of
from ..observability import Metrics
from ..state.offload import Offload
from ..state.users import ApiKey, UserStore
from .admission import Admission

if TYPE_CHECKING:
    from ..metrics_publish import Publisher
    from ..rooms.service import RoomService
    from ..stream.front import StreamFront
    from ..stream.service import StreamService
    from ..tracing import Tracer
    from ..vision.service import VisionService
    from .tickets import Tickets

ANONYMOUS = ApiKey("anonymous", "no-auth", ("translate", "admin"), 0.0, False)


@dataclass(frozen=True)
class AppContext:
    """What the routes reach through ``request.app.state.ctx`` (built once in ``create_app``)."""

    settings: Settings
    translator: FileTranslator
    store: UserStore  # keys and glossaries (state/users.py): call it through ``offload``
    metrics: Metrics
    admission: Admission
    ready: threading.Event  # set once the warm-up has run (/readyz)
    offload: Offload  # runs the store's blocking calls off the event loop (state/offload.py)


# /readyz's checks of a ``serve --workers`` worker (api/workers.py): its model process answers (None) or why not
ModelCheck = Callable[[], Awaitable[str | None]]
# the warm engine runners' states by model ("ready", "building", "failed: why"): this process's probe
# (serving/gpu/server.py warm_engine) or a worker's call to its model process
EngineStates = dict[str, str]
EngineProbe = Callable[[], EngineStates | Awaitable[EngineStates]]


class AppState(State):
    """Everything the app and its routes read off ``app.state``, typed; read it through ``app_state(app)``.
    ``create_app`` makes it the app's ``state`` (a starlette State still: ``app.state.streams`` is the same
    attribute, as cluster/gateway.py, tracing/http.py, the CLI and the tests read it). The first group is set here;
    the second by the step of ``create_app`` that builds it, before the app serves; the last is None unless set."""

    ctx: AppContext
    metrics: Metrics
    engine: FileTranslator  # ctx.translator
    store: UserStore  # ctx.store
    settings: Settings  # ctx.settings
    metrics_publisher: Publisher | None  # the cluster view's source (metrics_publish.py); None without Redis
    drain_files: Callable[[float], None]  # at shutdown: file requests still running are answered 503 draining

    vision: VisionService  # api/vocab.py
    tickets: Tickets  # stream tickets: api/web.py (api/workers.py: a book shared by the workers)
    streams: StreamService  # the batched streams (api/app.py _install_streams)
    stream_front: StreamFront  # the streams and the per-stream baseline beside them
    drain: Callable[[float], Awaitable[None]]  # the streams' drain (api/server.py, cluster/gateway.py)
    rooms: RoomService  # api/rooms.py
    started: float  # time.time() once built

    tracer: Tracer | None  # tracing/http.py install: None with tracing off
    model_check: ModelCheck | None  # a worker's (api/workers.py)
    engine_state: EngineProbe | None  # with models.engine_warm (api/app.py), or a worker's (api/workers.py)

    def __init__(self, ctx: AppContext, publisher: Publisher | None) -> None:
        super().__init__()
        self.ctx = ctx
        self.metrics, self.engine, self.store, self.settings = ctx.metrics, ctx.translator, ctx.store, ctx.settings
        self.metrics_publisher = publisher
        self.drain_files = ctx.admission.begin_drain
        self.tracer = None
        self.model_check = None
        self.engine_state = None


def app_state(app: Starlette) -> AppState:
    """The app's typed state (``create_app`` installs it)."""
    state = app.state
    if not isinstance(state, AppState):
        raise TypeError("the app's state is not an AppState: build the app with api.create_app")
    return state


def context(request: Request) -> AppContext:
    return app_state(request.app).ctx


def route_path(route: object) -> str | None:
    """A route's path template: a starlette Route, WebSocketRoute or Mount (FastAPI's routes among them); None for
    anything else (no route matched, a Host)."""
    return route.path if isinstance(route, Route | WebSocketRoute | Mount) else None


# ---- auth --------------------------------------------------------------------------------------------------
def bearer(request: Request) -> str | None:
    h = request.headers.get("authorization", "")
    if h.lower().startswith("bearer "):
        return h[7:].strip()
    return request.headers.get("x-api-key")


async def authenticate(ctx: AppContext, secret: str | None, scope: str = "translate") -> ApiKey:
    """The key for ``secret`` if it holds ``scope``; ANONYMOUS (every scope) on a --no-auth server."""
    if not ctx.settings.server.auth:
        return ANONYMOUS
    return await ctx.offload(ctx.store.authenticate, secret, scope)


async def check_scrape(ctx: AppContext, secret: str | None) -> None:
    """/metrics with auth on: ``server.metrics_token`` (compared in constant time: a near miss learns nothing from
    the timing) or an admin key; else 401 ``unauthenticated`` (no secret, an unknown one, a wrong token) or 403
    ``forbidden`` (a key without the admin scope), as ``/v1/ops/metrics`` refuses. Open with --no-auth."""
    if not ctx.settings.server.auth:
        return
    token = ctx.settings.server.metrics_token
    if token and secret and hmac.compare_digest(secret.encode(), token.encode()):
        return
    try:
        await ctx.offload(ctx.store.authenticate, secret, "admin")
    except AuthenticationError as exc:
        raise AuthenticationError("/metrics needs an admin key or the server's metrics token (server.metrics_token) "
                                  f"as 'Authorization: Bearer ...': {exc.message}") from exc


def require(scope: str) -> Callable[[Request], Awaitable[ApiKey]]:
    """A FastAPI dependency: the request's API key, checked for ``scope`` (401 / 403 otherwise)."""

    async def key(request: Request) -> ApiKey:
        return await authenticate(context(request), bearer(request), scope)

    return key


TranslateKey = Annotated[ApiKey, Depends(require("translate"))]
AdminKey = Annotated[ApiKey, Depends(require("admin"))]


# ---- request bodies ----------------------------------------------------------------------------------------
async def read_form(request: Request) -> FormData:
    """The request's form, within the HTTP limits: body size (Content-Length), parts, fields and part size."""
    limits = context(request).settings.limits
    limit = limits.max_upload_bytes
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit + 64 * 1024:
        raise TooLarge(f"request body is {length} bytes; the limit is {limit}",
                       details={"limit": "max_upload_bytes"})
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise InvalidParameter("send multipart/form-data (a 'file' or a 'text' field plus parameters)")
    try:
        return await request.form(max_files=2, max_fields=32, max_part_size=limits.max_text_chars * 4)
    except (MultiPartException, StarletteHTTPException, ValueError) as exc:  # malformed multipart bodies
        if "exceeded maximum size" in str(exc):  # a form field (not a file) over max_part_size: a long text
            raise TooLarge(f"a form field is over {limits.max_text_chars * 4} bytes; a text may hold at most "
                           f"{limits.max_text_chars} characters (send a longer one as a file)",
                           details={"limit": "max_text_chars"}) from exc
        raise InvalidParameter(f"malformed form body: {exc}") from exc
    except ClientDisconnect as exc:  # the client went away mid-body: nobody to answer, nothing to log
        raise InvalidParameter("the client disconnected before the body ended") from exc


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(request: Request) -> bool:
    """The body is declared ``application/json`` (or ``application/...+json``)."""
    ctype = _content_type(request)
    return ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))


def check_json_type(request: Request) -> None:
    """UnsupportedContentType (415) unless the body is declared JSON (``is_json``)."""
    if not is_json(request):
        raise UnsupportedContentType(f"this route takes a JSON body: send 'Content-Type: application/json' "
                                     f"(not {_content_type(request) or 'none'})")


def parse_json(body: bytes, bounds: JsonBounds,
               loads: Callable[[bytes, JsonBounds], object] = strict_json.loads) -> object:
    """``loads(body, bounds)``, strictly: not JSON, nesting deep enough to exhaust the parser (RecursionError, a 500
    before), NaN / Infinity or lone surrogates are InvalidParameter (400); past ``bounds`` (depth, elements:
    json_bounds.py), measured before parsing, TooLarge (413)."""
    try:
        return loads(body, bounds)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidParameter("the body is not valid JSON") from exc


async def require_json(request: Request) -> None:
    """A dependency of the JSON routes: the body must be declared ``application/json`` (or ``+json``) and be JSON.
    A page in a browser can POST forms and text/plain anywhere without asking; JSON it can send elsewhere only
    after a CORS preflight, which this server never grants. The body is parsed here once, strictly
    (``parse_json``); the route's own ``request.json()`` then parses what passed."""
    check_json_type(request)
    parse_json(await request.body(), bounds_of(context(request).settings))


JsonBody = Depends(require_json)


def flag(value: object) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}
