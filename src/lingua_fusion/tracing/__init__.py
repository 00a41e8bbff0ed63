"""OpenTelemetry traces: one span per stage of a file request or a live stream, exported over OTLP/HTTP.

Off by default, and then free: nothing imports OpenTelemetry, no span object is made, and a stage's hook is one
``is None`` check (``span(None, ...)`` is a shared null context). On when ``otel.endpoint`` is set
(``LINGUAFUSION_OTEL__ENDPOINT=http://collector:4318``; ``from_settings``). The tree (docs/observability.md):

    HTTP request (tracing/http.py: "POST /v1/translate", key_id) -> decode, asr | ocr, mt, tts | braille
    stream (StreamService.open .. its session's release: stream_id, key_id, slo) -> decode, vad, asr, mt, ocr, tts
        (one span per model call of this stream), journal.write (one per final)

The context is carried explicitly, never through contextvars across threads: a ``TraceRef`` (a span and the
``Tracer`` that made it) rides in ``CallContext.trace`` to the executor, which records each item's span once its
batch has run (``record_batch``), and in ``FileTranslator.translate(trace=...)`` to the request's worker thread.
Model work in another process (``serve --workers``' model process, a cluster's model replica): the caller's client
span goes over the wire as a W3C ``traceparent`` string (``TraceRef.client`` / ``traceparent``), and that process's
own tracer records the batch spans under it (``Tracer.remote``).
"""

from .core import Tracer, TraceRef, from_settings, record_batch, span

__all__ = ["TraceRef", "Tracer", "from_settings", "record_batch", "span"]
