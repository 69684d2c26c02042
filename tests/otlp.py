"""An OTLP/HTTP trace receiver on loopback: what a collector would get, decoded.

It takes ``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest``, as the
OpenTelemetry Collector's ``otlp`` receiver does on port 4318, decodes it with the
official protobuf messages (``opentelemetry-proto``) and keeps every span.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

from tests.servers import wait_for

KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass
class Span:
    """A received span, its ids as hex, as a tracing UI shows them."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    status: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any]
    raw: bytes = field(repr=False)  # the span's protobuf, for byte-level checks

    @classmethod
    def decode(cls, span: SpanProto, resource: dict[str, Any]) -> Span:
        return cls(
            name=span.name,
            kind=KINDS.get(span.kind, str(span.kind)),
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_id=span.parent_span_id.hex(),
            attributes=_attributes(span.attributes),
            events=[(e.name, _attributes(e.attributes)) for e in span.events],
            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
            status=span.status.code,
            resource=resource,
            raw=span.SerializeToString(),
        )


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.bodies: list[bytes] = []  # every export request as received
        self.content_types: list[str] = []
        self._lock = threading.Lock()
        self.url = ""

    def take(self, body: bytes, content_type: str) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self._lock:
            self.bodies.append(body)
            self.content_types.append(content_type)
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(Span.decode(span, resource))

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()
            self.bodies.clear()

    def trace(self, trace_id: str, runs: int = 1, timeout: float = 10.0) -> list[Span]:
        """The spans of trace ``trace_id``, once ``runs`` run spans of it were exported
        (a run's leg spans end before it, so they came first)."""

        def spans() -> list[Span]:
            with self._lock:
                found = [s for s in self.spans if s.trace_id == trace_id]
            ended = [s for s in found if "gateway.protocol" in s.attributes]  # run spans
            return found if len(ended) >= runs else []

        found: list[Span] = wait_for(spans, timeout, f"no run span in trace {trace_id}")
        return found

    def resumes(self, run_id: str, count: int = 1, timeout: float = 10.0) -> list[Span]:
        """The ``count`` resume spans of run ``run_id`` (each ends with its stream)."""

        def ended() -> list[Span]:
            with self._lock:
                found = [
                    s
                    for s in self.spans
                    if s.name == "resume" and s.attributes.get("gateway.run.id") == run_id
                ]
            return found if len(found) >= count else []

        found: list[Span] = wait_for(ended, timeout, f"no resume span of run {run_id}")
        return found

    def of_run(self, run_id: str, timeout: float = 10.0) -> list[Span]:
        """The spans of the trace of run ``run_id``'s (first) run span."""

        def runs() -> list[Span]:
            with self._lock:
                return [
                    s
                    for s in self.spans
                    if s.attributes.get("gateway.run.id") == run_id and s.name != "resume"
                ]

        [first, *_] = wait_for(runs, timeout, f"no span of run {run_id}")
        return self.trace(first.trace_id)


@contextlib.contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receiver.take(body, self.headers.get("content-type", ""))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
