"""One place that sees every request end: its counters, its TTFB and its log line.

``Observer`` is plain ASGI middleware. It hands the endpoint a ``RequestLog``
(through the ``current`` context variable) that the endpoint fills in — the route
it resolved, the run it started or resumed — and when the response is over
(its last body byte sent, or the client gone) it counts the request, observes
time to first byte, adds the bytes relayed, and logs one line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.metrics import Metrics

if TYPE_CHECKING:
    from gateway.runs.run import Run

logger = logging.getLogger("gateway.access")

CLIENT_CLOSED = 499  # the client left before any response was sent (nginx's convention)
OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass(slots=True)
class RequestLog:
    method: str
    path: str
    started: float
    route: str  # the metrics label: a configured route's match, or a kind of endpoint
    run: Run | None = None
    resumed_from: int | None = None
    status: int = 0
    first_byte: float | None = None
    sent: int = 0
    complete: bool = False
    disconnected: bool = False
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


current: ContextVar[RequestLog | None] = ContextVar("gateway_request", default=None)


def request_log() -> RequestLog:
    """The record of the request being served (endpoints only run inside ``Observer``)."""
    record = current.get()
    assert record is not None, "Observer is not installed"
    return record


def route_kind(path: str) -> str:
    """The route label before an endpoint names one."""
    if path in OPS_PATHS:
        return "ops"
    if path.startswith("/v1/runs/"):
        return "runs"
    if path.startswith("/v1/") and path != "/v1/chat/completions":
        return "passthrough"
    return "none"


class ObservedSend:
    """The ``send`` an observed request's app is given: it notes the response's status,
    its first byte and the bytes sent, then sends.

    A streaming response that gets one unwrapped (``RunStream``) may note its chunks
    itself (``sent``) and send them with ``raw``: one call per chunk instead of two.
    Wrapped by anything else (Starlette's exception middleware), it is a plain ``send``.
    """

    __slots__ = ("raw", "record", "_observer")

    def __init__(self, raw: Send, record: RequestLog, observer: Observer) -> None:
        self.raw = raw
        self.record = record
        self._observer = observer

    async def __call__(self, message: Message) -> None:
        record = self.record
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            if body:
                self.sent(len(body))
            if not message.get("more_body", False):
                record.complete = True
        elif message["type"] == "http.response.start":
            record.status = message["status"]
        await self.raw(message)

    def sent(self, size: int) -> None:
        """``size`` bytes of the response body are being sent."""
        record = self.record
        if record.first_byte is None:
            record.first_byte = time.perf_counter()
            self._observer.first_byte(record)
        record.sent += size


class Observer:
    def __init__(self, app: ASGIApp, metrics: Metrics, *, content: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        record = RequestLog(scope["method"], path, time.perf_counter(), route_kind(path))
        token = current.set(record)

        async def observed_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                record.disconnected = not record.complete
            return message

        try:
            await self.app(scope, observed_receive, ObservedSend(send, record, self))
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except Exception as exc:
            record.error = type(exc).__name__
            raise
        finally:
            current.reset(token)
            self.finish(record)

    def first_byte(self, record: RequestLog) -> None:
        """Time to first byte of a chat run's answer (not of an error, not of a resume)."""
        if record.run is not None and record.resumed_from is None and record.status < 400:
            assert record.first_byte is not None
            self.metrics.ttfb.labels(record.route).observe(record.first_byte - record.started)

    def finish(self, record: RequestLog) -> None:
        ended = time.perf_counter()
        if not record.status:  # nothing was sent: the client left, or an unhandled error
            record.status = CLIENT_CLOSED if record.disconnected else 500
        metrics, route = self.metrics, record.route
        metrics.requests.labels(route, record.method, str(record.status)).inc()
        if record.sent:
            metrics.relayed_bytes.labels(route).inc(record.sent)
        level = logging.DEBUG if route == "ops" else logging.INFO
        if logger.isEnabledFor(level):
            logger.log(level, "request", extra=self.line(record, ended))
        if record.run is not None:
            # uvicorn's keep-alive timer holds the request's context, and so this record,
            # while the connection idles: the run's id stays, the run (prompt, answer) goes.
            record.extra["run_id"] = record.run.id
            record.run = None

    def line(self, record: RequestLog, ended: float) -> dict[str, Any]:
        """The request's log fields: what happened, never a key, a prompt or an answer."""
        line: dict[str, Any] = {
            "method": record.method,
            "path": record.path,
            "status": record.status,
            "route": record.route,
            "duration_ms": _ms(ended - record.started),
            "bytes": record.sent,
        }
        if record.first_byte is not None:
            line["ttfb_ms"] = _ms(record.first_byte - record.started)
        if not record.complete:
            line["incomplete"] = True  # the response body did not end normally
        if record.disconnected:
            line["client_closed"] = True
        if record.error is not None:
            line["error"] = record.error
        if record.resumed_from is not None:
            line["resumed_from"] = record.resumed_from
        run = record.run
        if run is not None:
            line["run_id"] = run.id
            line["upstream"] = run.leg.upstream.name
            line["attempt"] = run.attempts.made
            line["leg"] = run.leg_index
            line["recoveries"] = run.recoveries
            if run.outcome is not None:
                line["outcome"] = run.outcome
            if run.first_token_at is not None and record.resumed_from is None:
                line["ttft_ms"] = _ms(run.first_token_at - record.started)
            if self.content:
                line["messages"] = run.body.get("messages")
                line["completion"] = run.accumulator.text
        line.update(record.extra)
        return line


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
