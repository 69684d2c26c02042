"""OpenTelemetry traces of runs: a span per run, a child span per upstream attempt,
a span per resume.

Off by default. On with ``tracing.enabled: true``, or when the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set and
``tracing.enabled`` is not ``false``. The exporter is OTLP over HTTP (protobuf);
everything else is the SDK's standard environment: ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` (default
``parentbased_always_on``), ``OTEL_EXPORTER_OTLP_HEADERS``... (docs/tracing.md).

A run's span continues the client's W3C trace context (``traceparent``,
``tracestate``) and lasts as long as the run, which may outlive the request. Each
upstream request (first leg, retries, continuations, a takeover's) has its own
client span, and carries that span's ``traceparent``, so the provider's side joins
the trace. A resume (on any replica) is a span of its own, linked to the run's; a
takeover's run span is its child. Attribute names follow the GenAI semantic
conventions where they fit (``gen_ai.*``); the gateway's own are ``gateway.*``.

Never recorded unless the operator opts in (``tracing.capture_content``, or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``): the prompt and the
answer. Never recorded at all: credentials, headers, upstream URLs beyond their
host and port.

When off, nothing here runs, nor is even imported (the switches are in
``gateway.otel_env``): a run's ``trace`` is None and every hook is one ``is None``
test per attempt, none per delta; no provider, no exporter thread. A tracing hook
that fails is logged and the run goes on: a span is never worth an answer.

Past 450 lines on purpose: the one module that imports the OpenTelemetry SDK, so
that tracing off imports none of it (above); its spans (run, attempt, resume) share
the tracer, the attribute names and the safety wrapper.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast
from urllib.parse import urlsplit

import orjson
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.config.schema import Tracing as TracingConfig
from gateway.otel_env import TRUE, check_protocol

if TYPE_CHECKING:
    from gateway.upstream.routes import ResolvedLeg

logger = logging.getLogger("gateway.tracing")
P = ParamSpec("P")
R = TypeVar("R")

SERVICE_NAME = "resumable-gateway"
_W3C = TraceContextTextMapPropagator()  # W3C trace context: what every tracer speaks

# gen_ai.provider.name by upstream kind (the GenAI conventions' well-known values).
PROVIDERS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
    "azure": "azure.ai.openai",
}


def _safe(default: Any = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A hook that logs its failure and returns ``default``: a span is never worth an
    answer (the hooks run inside the relay)."""

    def wrap(hook: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(hook)
        def safe(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return hook(*args, **kwargs)
            except Exception:  # noqa: BLE001 - logged; the run goes on
                logger.exception("tracing hook failed", extra={"hook": hook.__name__})
                return cast(R, default)

        return safe

    return wrap


class Tracing:
    """The process's tracer: one provider and exporter per gateway (per worker)."""

    def __init__(self, config: TracingConfig, env: Mapping[str, str]) -> None:
        check_protocol(env)
        # The config's name, else OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES (the SDK
        # reads them), else ours rather than the SDK's "unknown_service".
        configured = {"service.name": config.service_name} if config.service_name else {}
        resource = Resource.create(configured)
        service = str(resource.attributes.get("service.name", ""))
        if not service or service.startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
            service = SERVICE_NAME
        endpoint = None
        if config.endpoint is not None:  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is
            endpoint = config.endpoint.rstrip("/") + "/v1/traces"
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        exporter = OTLPSpanExporter(endpoint=endpoint)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        # Where spans go, without what the URL may carry besides its host (the headers,
        # which may hold a vendor's key, are never logged).
        where = endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        host, port = _host_port(
            where or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
        )
        logger.info(
            "tracing on",
            extra={"service": service, "otlp_host": host, "otlp_port": port},
        )
        self.tracer: Tracer = self._provider.get_tracer("resumable-gateway")
        capture = config.capture_content
        if capture is None:
            flag = env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
            capture = flag.lower() in TRUE
        self.capture_content = capture

    @_safe()
    def run(
        self,
        *,
        protocol: str,
        model: Any,
        route: str,
        run_id: str,
        stream: bool,
        provider: str,  # the first leg's upstream kind
        headers: Mapping[str, str],
        continues: str | None = None,
    ) -> RunTrace | None:
        """Start a run's span, as a child of the client's trace context in ``headers``.

        ``continues``: the ``traceparent`` of the run's span on the replica that
        started it (a takeover): linked, so the two are found together even when the
        resuming client sends no trace context of its own.
        """
        parent = _W3C.extract(headers)
        links = []
        if continues:
            earlier = trace.get_current_span(_W3C.extract({"traceparent": continues}))
            if earlier.get_span_context().is_valid:
                links.append(Link(earlier.get_span_context(), {"gateway.link": "takeover"}))
        span = self.tracer.start_span(
            f"chat {model}" if isinstance(model, str) else "chat",
            context=parent,
            kind=SpanKind.SERVER,
            links=links,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDERS.get(provider, provider),
                "gateway.protocol": protocol,
                "gateway.route": route,
                "gateway.run.id": run_id,
                "gateway.stream": stream,
                **({"gen_ai.request.model": model} if isinstance(model, str) else {}),
                **({"gateway.takeover": True} if continues is not None else {}),
            },
        )
        return RunTrace(self, span)

    @_safe()
    def resume(self, *, run_id: str, after: int, headers: Mapping[str, str]) -> ResumeTrace | None:
        """Start a resume's span, as a child of the client's trace context in ``headers``."""
        span = self.tracer.start_span(
            "resume",
            context=_W3C.extract(headers),
            kind=SpanKind.SERVER,
            attributes={"gateway.run.id": run_id, "gateway.resume.after": after},
        )
        return ResumeTrace(span)

    async def aclose(self) -> None:
        """Export what is left and stop the exporter's thread (off the event loop)."""
        await asyncio.to_thread(self._provider.shutdown)


class RunTrace:
    """One run's spans: the run's own, and the open attempt's (a leg span)."""

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self.span = span
        self._context = trace.set_span_in_context(span, Context())
        self._leg: Span | None = None
        self._seams = 0  # seam outcomes known when the open leg started
        self.ended = False  # its context stays: a last checkpoint still records it

    @property
    def traceparent(self) -> str:
        """The run span's W3C ``traceparent``: what a takeover links to."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, self._context)
        return carrier.get("traceparent", "")

    # -- attempts (leg spans) -------------------------------------------------------

    @_safe(default={})
    def attempt(
        self,
        leg: ResolvedLeg,
        *,
        index: int,
        attempt: int,
        plan: str,
        mode: str | None,
        delay: float,
        seams: int,
    ) -> dict[str, str]:
        """Start the span of an upstream request; the headers that carry it upstream."""
        self._close_leg()
        upstream = leg.upstream
        url = upstream.base_url
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDERS.get(upstream.kind, upstream.kind),
            "gen_ai.request.model": leg.model,
            "gateway.upstream": upstream.name,
            "gateway.leg": index,
            "gateway.attempt": attempt,
            "gateway.continuation": plan,
        }
        host, port = _host_port(url)
        if host:
            attributes["server.address"] = host
        if port:
            attributes["server.port"] = port
        if mode is not None:
            attributes["gateway.continuation.mode"] = mode
        if delay:
            attributes["gateway.backoff_s"] = round(delay, 3)
        self._leg = self._tracing.tracer.start_span(
            f"chat {leg.model}",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        self._seams = seams
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, trace.set_span_in_context(self._leg, self._context))
        return carrier

    @_safe()
    def attempt_failed(self, result: str, status: int | None, message: str) -> None:
        """The upstream request got no stream: an error status, a refused connection."""
        span = self._leg
        if span is None:
            return
        span.set_attribute("gateway.attempt.result", result)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        span.set_attribute("error.type", str(status) if status is not None else result)
        span.set_status(Status(StatusCode.ERROR, message))
        self._close_leg()

    @_safe()
    def attempt_answered(self, status: int) -> None:
        if self._leg is not None:
            self._leg.set_attribute("gateway.attempt.result", "ok")
            self._leg.set_attribute("http.response.status_code", status)

    @_safe()
    def interrupted(self, cause: str, message: str, sent_chars: int) -> None:
        """The open leg's stream broke: an event on it, and its span ends in error."""
        span = self._leg
        if span is None:
            return
        span.add_event(
            "gateway.interruption",
            {"gateway.interruption.cause": cause, "gateway.sent_chars": sent_chars},
        )
        span.set_attribute("error.type", cause)
        # The upstream's own words may quote the prompt or the answer (a content filter's).
        span.set_status(
            Status(StatusCode.ERROR, message if self._tracing.capture_content else cause)
        )

    @_safe()
    def leg_ended(self, usage: Mapping[str, Any] | None, estimated: bool, seams: list[str]) -> None:
        """The open leg's stream ended (whole or broken): what it cost, how it was joined."""
        span = self._leg
        if span is None:
            return
        _set_usage(span, usage)
        if usage is not None and estimated:
            span.set_attribute("gateway.usage.estimated", True)
        if len(seams) > self._seams:
            span.set_attribute("gateway.seam.outcome", seams[-1])
        self._close_leg()

    def _close_leg(self) -> None:
        if self._leg is not None:
            leg, self._leg = self._leg, None
            leg.end()

    # -- the run --------------------------------------------------------------------

    @_safe()
    def recovery(self, plan: str, cause: str, sent_chars: int) -> None:
        self.span.add_event(
            "gateway.recovery",
            {
                "gateway.recovery.plan": plan,
                "gateway.interruption.cause": cause,
                "gateway.sent_chars": sent_chars,
            },
        )

    @_safe()
    def first_token(self, seconds: float) -> None:
        self.span.set_attribute("gateway.time_to_first_token_s", round(seconds, 6))
        self.span.add_event("gateway.first_token")

    @_safe()
    def content(self, body: Mapping[str, Any], answer: str) -> None:
        """The prompt and the answer, when the operator opted in."""
        if not self._tracing.capture_content:
            return
        messages = body.get("messages", body.get("input"))
        prompt: dict[str, Any] = {"messages": messages}
        for key in ("system", "instructions"):
            if body.get(key) is not None:
                prompt[key] = body[key]
        self.span.set_attribute("gen_ai.input.messages", orjson.dumps(prompt).decode())
        output = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
        self.span.set_attribute("gen_ai.output.messages", orjson.dumps(output).decode())

    @_safe()
    def end(
        self,
        *,
        outcome: str | None,
        identity: Mapping[str, Any] | None,
        finish_reason: str | None,
        usage: Mapping[str, Any] | None,
        attempts: int,
        recoveries: int,
        legs: int,
        seams: list[str],
        error: str | None,
    ) -> None:
        self.ended = True
        if self._leg is not None and error is not None:  # the run failed with it open
            self._leg.set_attribute("error.type", error)
            self._leg.set_status(Status(StatusCode.ERROR))
        self._close_leg()
        span = self.span
        identity = identity or {}
        if isinstance(identity.get("model"), str):
            span.set_attribute("gen_ai.response.model", identity["model"])
        if isinstance(identity.get("id"), str):
            span.set_attribute("gen_ai.response.id", identity["id"])
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        _set_usage(span, usage)
        span.set_attribute("gateway.outcome", outcome or "failed")
        span.set_attribute("gateway.attempts", attempts)
        span.set_attribute("gateway.recoveries", recoveries)
        span.set_attribute("gateway.legs", legs)
        if seams:
            span.set_attribute("gateway.seam.outcomes", seams)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class ResumeTrace:
    """A resume's span, from its request to the end of the rest it streams. It links the
    run's span (a resume is another request, often of another trace); a takeover's run
    span is its child."""

    def __init__(self, span: Span) -> None:
        self.span = span

    @property
    @_safe(default={})
    def context(self) -> dict[str, str]:
        """The span's W3C trace context, for a takeover's run span to continue."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, trace.set_span_in_context(self.span, Context()))
        return carrier

    @_safe()
    def placed(self, kind: str, run_traceparent: str | None) -> None:
        """Where the resume found the run (a ``kind`` of ``gateway_resumes_total``), and
        the run's span."""
        self.span.set_attribute("gateway.resume.kind", kind)
        if run_traceparent:
            run = trace.get_current_span(_W3C.extract({"traceparent": run_traceparent}))
            if run.get_span_context().is_valid:
                self.span.add_link(run.get_span_context(), {"gateway.link": "resumes"})

    @_safe()
    def refused(self, error: BaseException) -> None:
        """Refused before streaming: unknown run, not placeable, the store down (or the
        request cancelled meanwhile)."""
        code = getattr(error, "code", None) or type(error).__name__
        self.span.set_attribute("error.type", code)
        if getattr(error, "status_code", 500) >= 500:  # a client's 404 or 409 is no fault here
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()

    def follow(self, rest: AsyncIterator[bytes] | None) -> Following | None:
        """``rest``, ending the span when it ends (at once if there is none)."""
        if rest is None:
            self.end(0)
            return None
        return Following(self, rest)

    @_safe()
    def end(self, sent: int) -> None:
        """End the span (once: a stream may end, then be closed, then be dropped)."""
        if self.span.is_recording():
            self.span.set_attribute("gateway.resume.bytes", sent)
            self.span.end()


class Following:
    """A resume's rest as it is streamed, ending its span when the rest ends, when it is
    closed (even unread: a client gone before the first read) or when it is dropped
    unread (a response never sent)."""

    def __init__(self, trace: ResumeTrace, rest: AsyncIterator[bytes]) -> None:
        self._trace = trace
        self._rest = rest
        self._sent = 0

    def __aiter__(self) -> Following:
        return self

    async def __anext__(self) -> bytes:
        try:
            data = await anext(self._rest)
        except BaseException:  # its end, a failure, the client leaving (a cancellation)
            self._trace.end(self._sent)
            raise
        self._sent += len(data)
        return data

    async def aclose(self) -> None:
        try:
            close = getattr(self._rest, "aclose", None)  # a follower leaves its run now
            if close is not None:
                await close()
        finally:
            self._trace.end(self._sent)

    def __del__(self) -> None:
        self._trace.end(self._sent)


def _set_usage(span: Span, usage: Mapping[str, Any] | None) -> None:
    if not isinstance(usage, Mapping):  # none, or an upstream's malformed one
        return
    # Chat's names, or the Responses and Messages ones.
    for kind, chat in (("input", "prompt"), ("output", "completion")):
        tokens = usage.get(f"{kind}_tokens", usage.get(f"{chat}_tokens"))
        if isinstance(tokens, int):
            span.set_attribute(f"gen_ai.usage.{kind}_tokens", tokens)


def _host_port(url: str) -> tuple[str | None, int | None]:
    try:
        parts = urlsplit(url)
        return parts.hostname, parts.port
    except ValueError:
        return None, None
