"""An HTTP/2 chat completions upstream: the chaos upstream's answers, over h2 (``h2``).

asyncio, one task per connection and one per stream; TLS with ALPN ``h2`` (or
cleartext with prior knowledge, without ``ssl``). ``POST /v1/chat/completions``
answers as ``gateway/chaos/server.py`` does (the same spec grammar, scripts,
continuations from an assistant prefix with a ``<<<anchor>>>``, ``times=`` and
``attempt`` counted by spec string), streaming SSE as one DATA frame per event;
``GET /v1/models`` lists the model. Not supported: ``/v1/completions``,
``/v1/responses``, ``/v1/messages``, embeddings, ``split=`` (h2 frames events).

Faults, after ``at`` content deltas:

- ``goaway``: a GOAWAY (NO_ERROR) whose last stream id is below the stream's own
  (its id - 2, or 0), so the stream counts as never processed; then the
  connection closes. Other streams open on the connection die with it.
- ``rst_stream``: RST_STREAM INTERNAL_ERROR on that stream; the connection stays up.
- ``reset``: a TCP RST; ``close``: the connection closes (TLS close_notify, FIN),
  no GOAWAY; ``stall``: nothing more on the stream for ``stall_s``, then RST_STREAM.
- the in-band ones (``error``, ``no_finish``, ...) and ``http_*`` statuses as the
  chaos upstream sends them; ``reset_before``: a TCP RST before any answer.

Every request is recorded (``H2Request``), with the fault it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import socket
import time
from collections.abc import Sequence
from ssl import SSLContext
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import orjson

from gateway.chaos import render
from gateway.chaos.answer import attempt_deltas, chat_plan, echo_of, script_for
from gateway.chaos.asked import anchor_of, assistant_prefix, ends_in_prefill, find_prefix
from gateway.chaos.faults import break_stream, fault_cut, reset
from gateway.chaos.spec import (
    HTTP2_FAULTS,
    HTTP_FAULTS,
    STREAM_FAULTS,
    ChaosSpec,
    SpecCounts,
    parse_spec,
)

logger = logging.getLogger("tests.net.h2_upstream")

WRITE_TIMEOUT = 30.0
Headers = list[tuple[str, str]]


@dataclasses.dataclass
class H2Request:
    """A request the server received; for a completion, what it answered and its fault.

    ``connection`` numbers the connections (1: the first accepted), so a test can
    tell whether two requests shared one. ``fault`` is the fault this request got
    (None: none, or ``times=`` spared it).
    """

    method: str
    path: str
    headers: dict[str, str]  # lower-case names, without the pseudo-headers
    body: Any  # the parsed JSON body, or None
    authority: str = ""
    http_version: str = "2"
    stream_id: int = 0
    connection: int = 0
    attempt: int | None = None
    fault: str | None = None
    prefix: str | None = None
    echo: str | None = None
    answered_text: str | None = None


@dataclasses.dataclass
class _Incoming:
    headers: Headers
    body: bytearray = dataclasses.field(default_factory=bytearray)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class H2Upstream:
    """The server. ``start()`` binds (port 0: a free port); ``aclose()`` drops every connection."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, ssl: SSLContext | None = None):
        self.host = host
        self._port = port
        self._ssl = ssl
        self.requests: list[H2Request] = []
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], _Connection] = {}
        self._numbers = itertools.count(1)
        self._ids = itertools.count(1)
        self.counts = SpecCounts()  # times= and attempts, as the chaos upstream counts them

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve_connection, self.host, self._port, ssl=self._ssl
        )
        self._port = self._server.sockets[0].getsockname()[1]

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the h2 upstream is not started")
        return self._port

    @property
    def base_url(self) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self.host}:{self.port}/v1"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def requests_for(self, model: str) -> list[H2Request]:
        return [
            r
            for r in list(self.requests)
            if isinstance(r.body, dict) and r.body.get("model") == model
        ]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task, connection in list(self._connections.items()):
            connection.writer.transport.abort()
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def next_id(self) -> int:
        return next(self._ids)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = self._connections[task] = _Connection(
            self, next(self._numbers), reader, writer
        )
        try:
            await connection.serve()
        except (ConnectionError, OSError, TimeoutError, asyncio.CancelledError):
            pass  # the client went away, or aclose(); 3.11 would log a cancellation
        except Exception:
            logger.exception("h2 upstream: unexpected error; connection closed")
        finally:
            del self._connections[task]
            writer.close()


class _Connection:
    """One HTTP/2 connection: reads frames, answers each stream from its own task."""

    def __init__(
        self,
        upstream: H2Upstream,
        number: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.upstream = upstream
        self.number = number
        self.reader = reader
        self.writer = writer
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config=config)
        self.window = asyncio.Event()  # set whenever the peer opens a flow-control window
        self.incoming: dict[int, _Incoming] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.transport.is_closing():
            self.writer.write(data)

    async def drain(self) -> None:
        async with asyncio.timeout(WRITE_TIMEOUT):
            await self.writer.drain()

    async def serve(self) -> None:
        self.conn.initiate_connection()
        self.flush()
        try:
            while not self.closed:
                data = await self.reader.read(65536)
                if not data:
                    break
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError:  # not h2 (HTTP/1.1 bytes), or broken
                    self.flush()  # h2 has queued a GOAWAY PROTOCOL_ERROR
                    break
                for event in events:
                    self._on(event)
                self.flush()
                await self.drain()
        finally:
            self.closed = True
            tasks = list(self.tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, stream_id: int, task: asyncio.Task[None]) -> None:
        self.tasks.pop(stream_id, None)

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived) and event.stream_id:
            headers = [(_text(k), _text(v)) for k, v in event.headers or []]
            self.incoming[event.stream_id] = _Incoming(headers)
        elif isinstance(event, h2.events.DataReceived) and event.stream_id:
            if event.data and event.stream_id in self.incoming:
                self.incoming[event.stream_id].body += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id:
            incoming = self.incoming.pop(event.stream_id, None)
            if incoming is not None:
                task = asyncio.create_task(self._stream(event.stream_id, incoming))
                self.tasks[event.stream_id] = task
                task.add_done_callback(functools.partial(self._forget, event.stream_id))
        elif isinstance(event, h2.events.StreamReset) and event.stream_id:
            self.incoming.pop(event.stream_id, None)
            running = self.tasks.get(event.stream_id)
            if running is not None:
                running.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.window.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True

    async def _stream(self, stream_id: int, incoming: _Incoming) -> None:
        try:
            await self._respond(stream_id, incoming)
        except (h2.exceptions.ProtocolError, ConnectionError, OSError, TimeoutError):
            pass  # the stream or the connection is gone
        except Exception:
            logger.exception("h2 upstream: unexpected error; stream reset")
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                self.flush()

    # -- sending -----------------------------------------------------------------------

    async def send_headers(self, stream_id: int, status: int, headers: Headers) -> None:
        self.conn.send_headers(stream_id, [(":status", str(status)), *headers])
        self.flush()
        await self.drain()

    async def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """``data`` in as many DATA frames as the peer's flow-control window lets through."""
        view = memoryview(data)
        while True:
            window = min(
                self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size
            )
            if view and window <= 0:
                self.window.clear()
                await self.window.wait()
                continue
            piece, view = view[:window], view[window:]
            if piece or end_stream:
                self.conn.send_data(stream_id, piece.tobytes(), end_stream=end_stream and not view)
                self.flush()
                await self.drain()
            if not view:
                return

    async def send_json(
        self, stream_id: int, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        head = [("content-type", "application/json"), ("content-length", str(len(body)))]
        await self.send_headers(stream_id, status, head + list(headers))
        await self.send_data(stream_id, body, end_stream=True)

    async def send_error(
        self, stream_id: int, status: int, message: str, code: str | None = None
    ) -> None:
        await self.send_json(
            stream_id, status, render.error_body(message, "invalid_request_error", code)
        )

    async def break_off(self, stream_id: int, fault: str, spec: ChaosSpec) -> None:
        """End a stream (and for some faults its connection) as ``fault`` says."""
        if fault == "goaway":
            self.conn.close_connection(error_code=0, last_stream_id=max(stream_id - 2, 0))
            self.flush()
            self.closed = True
            self.writer.close()  # after what is queued: the deltas, then the GOAWAY
        elif fault == "rst_stream":
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            self.flush()
        elif fault == "reset":
            self.closed = True
            await reset(self.writer)
        elif fault == "close":
            self.closed = True
            self.writer.close()
        elif fault == "stall":
            await asyncio.sleep(spec.stall_s)
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            self.flush()

    # -- answering ---------------------------------------------------------------------

    async def _respond(self, stream_id: int, incoming: _Incoming) -> None:
        pseudo = {k: v for k, v in incoming.headers if k.startswith(":")}
        headers: dict[str, str] = {}
        for name, value in incoming.headers:
            if not name.startswith(":"):
                name = name.lower()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        method, path = pseudo.get(":method", ""), pseudo.get(":path", "").partition("?")[0]
        try:
            payload = orjson.loads(incoming.body) if incoming.body else None
        except orjson.JSONDecodeError:
            payload = None
            bad_json = True
        else:
            bad_json = False
        recorded = H2Request(
            method,
            path,
            headers,
            payload,
            authority=pseudo.get(":authority", ""),
            stream_id=stream_id,
            connection=self.number,
        )
        self.upstream.requests.append(recorded)
        if bad_json:
            message = "We could not parse the JSON body of your request."
            await self.send_error(stream_id, 400, message)
        elif (method, path) == ("GET", "/v1/models"):
            await self.send_json(stream_id, 200, render.MODELS)
        elif (method, path) != ("POST", "/v1/chat/completions"):
            message = f"Unknown request URL: {method} {path}."
            await self.send_error(stream_id, 404, message, "unknown_url")
        elif not isinstance(payload, dict):
            await self.send_error(stream_id, 400, "The request body must be a JSON object.")
        else:
            await self._complete(stream_id, recorded, payload)

    async def _complete(self, stream_id: int, recorded: H2Request, payload: dict[str, Any]) -> None:
        """A chat completion, as ``ChaosUpstream._answer`` and ``_complete`` make it."""
        model = payload.get("model")
        model = model if isinstance(model, str) else "chaos"
        try:
            spec = parse_spec(recorded.headers.get("x-chaos", model))
        except ValueError as exc:
            await self.send_error(stream_id, 400, str(exc), "invalid_chaos_spec")
            return
        if not spec.prefill and ends_in_prefill(payload):
            message = (
                "This model does not support assistant message prefill. "
                "The conversation must end with a user message."
            )
            await self.send_error(stream_id, 400, message)
            return
        attempt = recorded.attempt = self.upstream.counts.take_attempt(spec)
        fault = recorded.fault = self.upstream.counts.take_fault(spec)
        if fault == "reset_before":
            self.closed = True
            await reset(self.writer, flush=False)
            return
        if spec.first_byte_ms:
            await asyncio.sleep(spec.first_byte_ms / 1000)
        if fault in HTTP_FAULTS:
            message, kind, code = render.HTTP_ERRORS[fault]
            extra = [("retry-after", str(spec.retry_after))] if fault == "http_429_retry" else []
            body = render.error_body(message, kind, code)
            await self.send_json(stream_id, HTTP_FAULTS[fault], body, extra)
            return

        script = script_for(spec)
        # find_prefix: the assistant prefix, if this answer starts with it; sample=1 continues any.
        prefix = assistant_prefix(payload) if spec.sample else find_prefix(payload, script.text)
        echo = echo_of(spec, prefix, anchor_of(payload, prefix))
        deltas = attempt_deltas(spec, attempt, prefix)
        text = script.text[len(prefix) :] if deltas is None else "".join(deltas)
        recorded.prefix, recorded.echo, recorded.answered_text = prefix, echo, text
        plan = chat_plan(script, prefix, echo, deltas)
        messages = payload.get("messages")
        prompt_tokens = 10 + (len(messages) if isinstance(messages, list) else 1)
        usage = render.usage(prompt_tokens, sum(plan.counts))
        response_id = f"chatcmpl-chaos-h2-{self.upstream.next_id()}"
        created = int(time.time())
        # What the body does at the fault: goaway and rst_stream cut where reset would.
        breaking = HTTP2_FAULTS.get(fault, fault) if fault is not None else None

        if payload.get("stream") is not True:
            body = render.chat_completion(response_id, created, model, script, echo + text, usage)
            if breaking not in ("reset", "close") or fault is None:
                await self.send_json(stream_id, 200, body)
                return
            head = [("content-type", "application/json"), ("content-length", str(len(body)))]
            await self.send_headers(stream_id, 200, head)
            await self.send_data(stream_id, body[: len(body) // 2])
            await self.break_off(stream_id, fault, spec)
            return

        envelope = render.chat_envelope(response_id, created, model)
        trailer = []
        options = payload.get("stream_options")
        if spec.usage and isinstance(options, dict) and options.get("include_usage") is True:
            trailer.append(
                render.usage_chunk(response_id, "chat.completion.chunk", created, model, usage)
            )
        payloads, ending = break_stream(
            breaking if breaking in STREAM_FAULTS else None,
            fault_cut(plan.counts, spec.at),
            [envelope.chunk(body) for body in plan.bodies],
            trailer,
            spec.done,
            envelope.chunk(b'{},"finish_reason":"error"'),
        )
        events = render.EventFormat(spec.line_ending, spec.comments)
        head = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        await self.send_headers(stream_id, 200, head)
        for index, data in enumerate(payloads):
            if index and spec.pace_ms:
                await asyncio.sleep(spec.pace_ms / 1000)
            await self.send_data(stream_id, events.event(data, index))
        if ending == "end":
            await self.send_data(stream_id, b"", end_stream=True)
        else:
            assert fault is not None
            await self.break_off(stream_id, fault if fault in HTTP2_FAULTS else ending, spec)
