"""One error hierarchy for the whole package.

Map (code -> HTTP status):

    LinguaFusionError               500 internal         (never raised for a client's mistake)
      ClientError                   400 bad_request
        EmptyInput                  400 empty_input
        InvalidParameter            400 invalid_parameter
        UnknownLanguage             400 unknown_language
        MediaTypeMismatch           415 media_type_mismatch
        UnsupportedMedia            415 unsupported_media
        CorruptMedia                422 corrupt_media
        UnsupportedPair             422 unsupported_pair
        NoSpeech / NoText           422 no_content
        TooLarge                    413 too_large  (bytes, duration, pixels, text length)
        NotFound                    404 not_found
        AuthenticationError         401 unauthenticated
        PermissionDenied            403 forbidden
          OriginNotAllowed          403 origin_not_allowed (a browser page from an origin not on the allow-list)
          QuotaExceeded             403 quota_exceeded (glossaries per key)
          TargetNotAllowed          403 target_not_allowed (a room listener asked for a language the room does not
                                                            allow: details.allowed lists those it does)
        HostNotAllowed              400 host_not_allowed (a Host header not on the allow-list)
        UnsupportedContentType      415 unsupported_content_type (a JSON route sent something else)
        TakenOver                   409 taken_over (a stream resumed by another connection: this one ends)
      Overloaded                    429 overloaded (retryable, carries retry_after)
      SlowConsumer                  429 slow_consumer  (a stream's client stopped reading its events)
      Draining                      503 draining       (the server is shutting down: resume elsewhere; retryable)
      BackendError                  503 backend_unavailable (retryable; Retry-After)
        BackendFailed               503 backend_failed (a model worker process died mid-request; restarted)
        ModelTimeout                503 model_timeout
        MalformedOutput             503 malformed_output
        InjectedFault               503 injected_fault (chaos)
        StoreUnavailable            503 state_store_unavailable (the stream log; the rooms' Redis: ``store=``)
      RequestTimeout                504 timeout        (a file request past server.request_timeout_s, or no answer
                                                        within the SDK's timeout; retryable)

Foreign exceptions (PyAV, PIL, onnxruntime, subprocess) are translated where they occur with
``raise ... from exc``. Each error knows its HTTP status, a stable machine-readable ``code`` and
whether the caller may retry.

What a client is told is ``public_message``: the message itself for errors about the client's request (we write
those), a plain sentence per class for server-side failures (``public``: their message can name paths, addresses
or a library's error text; it goes to the server log). Secrets are redacted from both (``redact.py``).
"""

from __future__ import annotations

from collections.abc import Mapping


class LinguaFusionError(Exception):
    status = 500
    code = "internal"
    retryable = False
    public: str | None = "internal error; see the server log"  # None: the message itself is for the client
    retry_after: float | None = None  # seconds a client should wait before a retry (Retry-After), where one helps

    def __init__(self, message: str, *, details: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, object] = dict(details or {})  # JSON values: sent to the client as they are

    @property
    def public_message(self) -> str:
        """What a client may read: never a server path, address or secret."""
        from .redact import redact

        return redact(self.message if self.public is None else self.public)

    def to_dict(self) -> dict[str, object]:
        """The error's JSON body: ``code``, ``message`` and, when it has them, ``details`` (JSON values)."""
        body: dict[str, object] = {"code": self.code, "message": self.public_message}
        if self.details:
            body["details"] = self.details
        return body


class ClientError(LinguaFusionError):
    status = 400
    code = "bad_request"
    public = None


class EmptyInput(ClientError):
    code = "empty_input"


class InvalidParameter(ClientError):
    code = "invalid_parameter"


class UnknownLanguage(ClientError):
    code = "unknown_language"


class MediaTypeMismatch(ClientError):
    status = 415
    code = "media_type_mismatch"


class UnsupportedMedia(ClientError):
    status = 415
    code = "unsupported_media"


class CorruptMedia(ClientError):
    status = 422
    code = "corrupt_media"


class UnsupportedPair(ClientError):
    status = 422
    code = "unsupported_pair"


class NoContent(ClientError):
    status = 422
    code = "no_content"


class TooLarge(ClientError):
    status = 413
    code = "too_large"


class NotFound(ClientError):
    status = 404
    code = "not_found"


class AuthenticationError(ClientError):
    status = 401
    code = "unauthenticated"


class PermissionDenied(ClientError):
    status = 403
    code = "forbidden"


class OriginNotAllowed(PermissionDenied):
    code = "origin_not_allowed"


class QuotaExceeded(PermissionDenied):
    code = "quota_exceeded"


class TargetNotAllowed(PermissionDenied):
    code = "target_not_allowed"


class HostNotAllowed(ClientError):
    code = "host_not_allowed"


class UnsupportedContentType(ClientError):
    status = 415
    code = "unsupported_content_type"


class TakenOver(ClientError):
    status = 409
    code = "taken_over"


class Overloaded(LinguaFusionError):
    status = 429
    code = "overloaded"
    retryable = True
    public = None

    def __init__(self, message: str, *, retry_after: float = 1.0, details: Mapping[str, object] | None = None,
                 not_serving: bool = False):
        super().__init__(message, details=details)
        self.retry_after = retry_after
        # refused because the server cannot serve a new stream at all just now (it drains, or its model process
        # restarts or does not answer), not for want of room: counted apart (linguafusion_streams_unavailable_total)
        self.not_serving = not_serving


class SlowConsumer(LinguaFusionError):
    status = 429
    code = "slow_consumer"
    public = None


class Draining(LinguaFusionError):
    status = 503
    code = "draining"
    retryable = True
    public = None


class NotConfigured(LinguaFusionError):
    """What this server, as it is configured, does not offer (rooms under ``serve --workers`` without a shared
    Redis): the operator can change that, the client cannot."""

    status = 501
    code = "not_configured"
    public = None


class BackendError(LinguaFusionError):
    status = 503
    code = "backend_unavailable"
    retryable = True
    retry_after = 1.0  # seconds, the Retry-After a client is sent
    public: str | None = "a model or service the server needs is unavailable; retry later"


class BackendFailed(BackendError):
    """A model worker process died in the middle of this work (a crash in native code, a kill): only the work in
    flight is lost; the worker is restarted (supervise/), so a retry after ``retry_after`` seconds may succeed."""

    code = "backend_failed"
    public = "a model worker failed while serving this request; retry later"

    def __init__(self, message: str, *, retry_after: float = 1.0, details: Mapping[str, object] | None = None) -> None:
        super().__init__(message, details=details)
        self.retry_after = retry_after


class ModelTimeout(BackendError):
    code = "model_timeout"
    public = "a model did not answer in time; retry later"


class CapacityExhausted(BackendError):
    """A model engine's memory (the GPU's paged pools) is full for now: committed work is retried, a partial is
    dropped."""

    code = "engine_full"
    public = "the model engine is full for the moment; retry later"


class MalformedOutput(BackendError):
    code = "malformed_output"
    public = "a model returned malformed output; retry later"


class InjectedFault(BackendError):
    code = "injected_fault"
    public = None  # chaos experiments: the message names the fault, nothing of the server


class StoreUnavailable(BackendError):
    code = "state_store_unavailable"
    public = "the stream log is unavailable; retry later"

    def __init__(self, message: str, *, store: str = "the stream log", details: Mapping[str, object] | None = None):
        """``store``: which one, as the client reads it (the rooms' Redis, the stream log, ...)."""
        super().__init__(message, details=details)
        self.public = f"{store} is unavailable; retry later"


class RequestTimeout(LinguaFusionError):
    status = 504
    code = "timeout"
    retryable = True
    public = None


_BY_CODE: dict[str, type[LinguaFusionError]] = {}


def _index(cls: type[LinguaFusionError]) -> None:
    _BY_CODE.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _index(sub)


_index(LinguaFusionError)


def from_code(code: str, message: str, *, status: int | None = None, details: Mapping[str, object] | None = None,
              retry_after: float | None = None) -> LinguaFusionError:
    """Rebuild a typed error from a server's JSON body (used by the SDK)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = ClientError if status is not None and 400 <= status < 500 else LinguaFusionError
    if cls is Overloaded:
        return Overloaded(message, retry_after=retry_after or 1.0, details=details)
    err = cls(message, details=details)
    if code not in _BY_CODE:
        err.code = code
    return err
