"""The tracer and its span handles. OpenTelemetry is imported only when a ``Tracer`` is made (tracing on).

A batched model call serves many streams, so its span is recorded once per item (``record_batch``): each item's
span has the batch's start and end and is parented to that item's own stream (or request), with the attributes
``batch_size``, ``batch_id`` (shared by the items of one batch, to find its siblings), ``model_key``,
``queue_wait_s`` and ``tentative``. Why per item and not one batch span with links: docs/observability.md.

Across a process boundary (``serve --workers``' model process, a cluster's model replica) the caller opens a client
span per call (``TraceRef.client``) and sends its W3C ``traceparent`` string (``TraceRef.traceparent``); the other
process's tracer turns it back into a parent (``Tracer.remote``) and records the batch spans under it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanKind

    from ..config import OtelSettings, Settings

# a span attribute as OpenTelemetry takes it (``_attrs``: anything else is recorded as its str)
Attribute = str | bool | int | float

log = logging.getLogger("lingua_fusion.tracing")
PREFIX = "linguafusion."  # our attributes' namespace: seq=3 is recorded as linguafusion.seq
_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()  # stateless: one shared instance serves every hook
_batches = itertools.count(1)


def _attrs(attrs: Mapping[str, object]) -> dict[str, Attribute]:
    """Our keyword attributes, namespaced; None dropped (OpenTelemetry takes str, bool, int, float and lists)."""
    out: dict[str, Attribute] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        out[k if "." in k else PREFIX + k] = v if isinstance(v, str | bool | int | float) else str(v)
    return out


def _wall_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` instant as the Unix-epoch nanoseconds a span wants."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class TraceRef:
    """One span, and the tracer that made it: what is handed down to parent the next spans."""

    __slots__ = ("_context", "_ended", "span", "tracer")

    def __init__(self, tracer: Tracer, otel_span: Span) -> None:
        self.tracer = tracer
        self.span = otel_span
        self._context: Context | None = None
        self._ended = False

    @property
    def context(self) -> Context:
        """The OpenTelemetry context with this span as the parent (made when a child first needs it)."""
        if self._context is None:
            self._context = self.tracer.api.set_span_in_context(self.span)
        return self._context

    @contextlib.contextmanager
    def child(self, name: str, *, kind: SpanKind | None = None, **attrs: object) -> Iterator[TraceRef]:
        """A span timed by the ``with`` block (any thread); an exception leaving the block marks it failed."""
        ref = TraceRef(self.tracer, self.tracer.otel.start_span(name, context=self.context, attributes=_attrs(attrs),
                                                                kind=kind or self.tracer.api.SpanKind.INTERNAL))
        try:
            yield ref
        except BaseException as exc:
            ref.fail(exc)
            raise
        finally:
            ref.end()

    def client(self, name: str, **attrs: object) -> contextlib.AbstractContextManager[TraceRef]:
        """A ``child`` of kind CLIENT with ``remote = true``: a call whose work another process records under it
        (send it ``traceparent()``)."""
        return self.child(name, kind=self.tracer.api.SpanKind.CLIENT, remote=True, **attrs)

    def traceparent(self) -> str:
        """This span as a W3C ``traceparent`` string (``00-<trace id>-<span id>-<flags>``), for another process."""
        carrier: dict[str, str] = {}
        self.tracer.propagator.inject(carrier, context=self.context)
        return carrier.get("traceparent", "")

    def record(self, name: str, start: float, end: float, attrs: Mapping[str, object],
               error: BaseException | None = None) -> None:
        """A child span that already happened: ``start`` and ``end`` on ``time.monotonic``'s clock."""
        begin = _wall_ns(start)
        otel_span = self.tracer.otel.start_span(name, context=self.context, attributes=_attrs(attrs), start_time=begin)
        if error is not None:
            TraceRef(self.tracer, otel_span).fail(error)
        otel_span.end(end_time=max(_wall_ns(end), begin))

    def set(self, **attrs: object) -> None:
        self.span.set_attributes(_attrs(attrs))

    def fail(self, exc: BaseException) -> None:
        """Mark the span failed with the error's code and public message (never a secret, a path or a traceback).
        A cancellation is not a failure: it is only noted."""
        from ..errors import LinguaFusionError

        if not isinstance(exc, Exception):  # CancelledError, GeneratorExit: the work was abandoned
            self.set(cancelled=True)
            return
        if isinstance(exc, LinguaFusionError):
            code, message = exc.code, exc.public_message
        else:
            code, message = "internal", type(exc).__name__
        self.span.set_attributes({"error.type": code})
        self.span.set_status(self.tracer.status_error, message)

    def end(self, **attrs: object) -> None:
        """End the span (once; later calls do nothing)."""
        if self._ended:
            return
        self._ended = True
        if attrs:
            self.set(**attrs)
        self.span.end()


class Tracer:
    """A TracerProvider of our own (the process-global one is left alone) around one span processor."""

    def __init__(self, processor: SpanProcessor, service_name: str = "linguafusion", sample_ratio: float = 1.0) -> None:
        from opentelemetry import trace as api
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.api = api
        self.status_error = api.StatusCode.ERROR
        # process.pid: a sharded server's worker and model process (or a cluster's gateway and replica) share
        # service.name; the pid says which process recorded a span
        resource = Resource.create({"service.name": service_name, "process.pid": os.getpid()})
        self.provider = TracerProvider(resource=resource,
                                       sampler=ParentBased(TraceIdRatioBased(sample_ratio)), shutdown_on_exit=False)
        self.provider.add_span_processor(processor)
        self.otel = self.provider.get_tracer("lingua_fusion")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def otlp(cls, cfg: OtelSettings) -> Tracer:
        """Spans batched (a bounded queue: beyond ``max_queue`` they are dropped, never waited for) and sent over
        OTLP/HTTP protobuf to ``cfg.endpoint`` by the processor's own thread."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        assert cfg.endpoint
        exporter = OTLPSpanExporter(endpoint=traces_url(cfg.endpoint), headers=dict(cfg.headers),
                                    timeout=cfg.timeout_s)
        processor = BatchSpanProcessor(exporter, max_queue_size=cfg.max_queue,
                                       schedule_delay_millis=cfg.export_interval_s * 1000,
                                       export_timeout_millis=cfg.timeout_s * 1000)
        return cls(processor, cfg.service_name, cfg.sample_ratio)

    @classmethod
    def to_exporter(cls, exporter: SpanExporter, service_name: str = "linguafusion") -> Tracer:
        """Every span handed to ``exporter`` as it ends (tests: the SDK's InMemorySpanExporter)."""
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        return cls(SimpleSpanProcessor(exporter), service_name)

    def root(self, name: str, headers: Mapping[str, str] | None = None, **attrs: object) -> TraceRef:
        """A span that starts a trace, or continues the caller's when ``headers`` hold a W3C ``traceparent``."""
        parent = self.propagator.extract(headers) if headers else None
        return TraceRef(self, self.otel.start_span(name, context=parent, attributes=_attrs(attrs),
                                                   kind=self.api.SpanKind.SERVER))

    def remote(self, traceparent: str | None) -> TraceRef | None:
        """The parent another process sent (``TraceRef.traceparent``): spans recorded under it join the caller's
        trace, as children of its client span. None when nothing (or nothing valid) was sent."""
        if not traceparent:
            return None
        parent = self.propagator.extract({"traceparent": traceparent})
        remote_span = self.api.get_current_span(parent)
        if not remote_span.get_span_context().is_valid:
            return None
        ref = TraceRef(self, remote_span)  # a NonRecordingSpan: ending it does nothing, exporting it never happens
        ref._context = parent
        return ref

    def stream(self, stream_id: str, key_id: str, slo: str, source_lang: str, targets: list[str],
               resumed: bool = False) -> TraceRef:
        """A live stream's span: every stage span of the stream is its child. Never the API key, only its id."""
        return self.root("stream", stream_id=stream_id, key_id=key_id, slo=slo, source_lang=source_lang,
                         targets=",".join(targets), resumed=resumed)

    def shutdown(self) -> None:
        """Send what is queued (bounded by the exporter's timeout), then stop."""
        self.provider.shutdown()


def traces_url(endpoint: str) -> str:
    """``http://collector:4318`` -> ``http://collector:4318/v1/traces``; a URL with a path is kept as given."""
    return endpoint.rstrip("/") + "/v1/traces" if urlsplit(endpoint).path in ("", "/") else endpoint


def from_settings(settings: Settings) -> Tracer | None:
    """The server's tracer: None (off, nothing imported) unless ``otel.endpoint`` is set. Set but without the
    OpenTelemetry SDK installed: an error in the log, and the server runs untraced."""
    cfg = settings.otel
    if not cfg.endpoint:
        return None
    try:
        tracer = Tracer.otlp(cfg)
    except ImportError as exc:
        log.error("otel.endpoint is set but the OpenTelemetry SDK is not installed (%s): install the 'otel' extra "
                  "(pip install 'linguafusion[otel]'); running without traces", exc)
        return None
    log.info("traces: OTLP/HTTP to %s as service %r", traces_url(cfg.endpoint), cfg.service_name)
    return tracer


def span(ref: TraceRef | None, name: str, *, kind: SpanKind | None = None,
         **attrs: object) -> contextlib.AbstractContextManager[TraceRef | None]:
    """A child span of ``ref`` for the ``with`` block; with tracing off (``ref`` None) a shared null context."""
    if ref is None:
        return _NULL
    return ref.child(name, kind=kind, **attrs)


def record_batch(model_key: object, stage: str, items: Sequence[tuple[TraceRef | None, float, bool | None]],
                 start: float | None, end: float, error: BaseException | None = None) -> None:
    """A model batch ran from ``start`` to ``end`` (``time.monotonic``; ``start`` None: each item's own enqueue
    time, for a batch that failed): one ``stage`` span per traced item ``(trace, enqueued, tentative)``, parented
    to that item's stream or request (``tentative`` None where the caller does not know it: a failed batch's
    items). Untraced items cost one check each."""
    traced = [item for item in items if item[0] is not None]
    if not traced:
        return
    batch_id = next(_batches)
    for ref, enqueued, tentative in traced:
        assert ref is not None
        begin = enqueued if start is None else max(start, enqueued)
        ref.record(stage, begin, end, {
            "model_key": str(model_key), "batch_size": len(items), "batch_id": batch_id, "tentative": tentative,
            "queue_wait_s": round(max(0.0, begin - enqueued), 6)}, error)
