"""The Responses API over a WebSocket: ``GET /v1/responses`` upgraded (ARCHITECTURE.md §2b).

Codex CLI's transport, and the openai SDK's ``client.responses.connect()``. Each
``response.create`` message is a run on the same engine as ``POST /v1/responses``
(legs, retries, recovery plans, checkpoints, breakers, traces, metrics, one log
line): its client events go out one text frame each, the JSON an SSE ``data:``
line would carry, in order; the socket stays open after the terminal event. An
upstream fault never reaches the socket: it is recovered, or it ends the response
with the same ``error`` and ``response.failed`` events HTTP gets.

One response at a time: a create that arrives before the running one's terminal
event gets an error frame (``response_in_progress``) and is not queued; one that
arrives after it waits its turn. An error before the response started
(an unknown model, an upstream's 4xx) is one frame ``{"type": "error", "status":
N, "error": {...}}``, which Codex reads as that HTTP status.

``previous_response_id``: the socket keeps its last response (and a warm-up's):
the input it was sent, expanded, and its whole output, encrypted reasoning
included. A request naming it is sent upstream with that context as ``input``
before its own items, so any Responses upstream serves a WebSocket client over
plain HTTP and SSE, ``store: false`` included. An id the socket does not know is
``previous_response_not_found`` under ``store: false``, and goes to the upstream
otherwise (its stored copy, as over HTTP). ``generate: false`` (Codex's warm-up) is
answered here, with a response that has an id and no output, and no model call.

Bounds (``websocket:`` in the config): sockets per process (one more is refused
with 426: the client uses HTTP), a message's size, the context kept, silence
between responses, and a socket's lifetime (then ``websocket_connection_limit_reached``
and a close, at a response's boundary, so the client reconnects). The wire under it
(messages read a few ahead, send deadlines, error frames, refused upgrades) is
``websocket.py``'s.

If the client's socket drops mid-response, the run goes on detached as a
disconnected HTTP client's does, checkpointed, and can be re-attached over HTTP
(``GET /v1/responses/{id}?stream=true``). Codex itself does not re-attach: it sends
the turn again on a new socket, which knows no earlier response, so under
``store: false`` it gets ``previous_response_not_found`` and sends its whole input.

Past 450 lines on purpose: ``Socket`` is one conversation's state (the context kept,
the response running, the bounds) whose steps (a message, a create, a warm-up, a run
relayed) share it; the wire is ``websocket.py``'s and the run is the engine's already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.api.answer import Asked, new_run, routed
from gateway.api.responses import whole_context
from gateway.api.websocket import Channel, Gone, deny, refuse_upgrade
from gateway.checkpoint.model import split_events
from gateway.context import Gateway, gateway_of
from gateway.errors import GatewayError, InvalidRequest, UpstreamFailure, error_body
from gateway.inbound import credential, trace_context
from gateway.observe import Observer, RequestLog, current
from gateway.protocols import RESPONSES
from gateway.protocols.responses import input_items
from gateway.protocols.responses_items import ResponsesAccumulator
from gateway.recovery.classify import RETRYABLE_STATUSES
from gateway.upstream.client import UpstreamHTTPError
from gateway.upstream.target import run_query

logger = logging.getLogger("gateway.responses")

PATH = "/v1/responses"
TERMINAL = (b"event: response.completed\n", b"event: response.incomplete\n")
ENDED = (*TERMINAL, b"event: response.failed\n")
# Transport fields of the HTTP create body that mean nothing on a socket.
TRANSPORT_FIELDS = ("type", "stream", "background", "stream_options", "generate")
# What a socket's client cannot tell by itself was already retried (as over HTTP).
NO_RETRY = {"x-should-retry": "false"}
# An upstream error's headers that tell a client when to come back.
RETRY_HEADERS = ("retry-after", "retry-after-ms")


async def serve_socket(scope: Scope, receive: Receive, send: Send) -> None:
    """Every WebSocket the gateway is asked for: the Responses API, or a 426."""
    websocket = WebSocket(scope, receive, send)
    gateway = gateway_of(websocket)
    metrics = gateway.metrics
    settings = gateway.config.websocket
    if scope["path"] != PATH or not settings.enabled:
        reason = "path" if scope["path"] != PATH else "disabled"
        metrics.websocket_refusals.labels(reason).inc()
        await refuse_upgrade(scope, receive, send, reason)
        return
    if gateway.open_sockets >= settings.max_connections:
        metrics.websocket_refusals.labels("full").inc()
        await refuse_upgrade(scope, receive, send, "full")
        return
    try:
        client_authorization = gateway.auth.authorize(websocket)
    except GatewayError as exc:
        await deny(scope, receive, send, exc.status_code, exc.body())
        return
    # Counted before the accept's await, so handshakes at once cannot all pass the check.
    gateway.open_sockets += 1
    metrics.websockets.inc()
    try:
        try:
            await websocket.accept()
        except (WebSocketDisconnect, OSError):
            return  # gone during the handshake
        await Socket(websocket, gateway, client_authorization).serve()
    finally:
        gateway.open_sockets -= 1
        metrics.websockets.dec()


@dataclass(slots=True)
class Context:
    """What a response on this socket stands for when the next names it: the input it
    was sent (its own context already expanded) and its whole output."""

    response_id: str
    items: list[Any]  # input, then output: the next request's input starts with them
    size: int
    # What it continued upstream, where the socket did not know it (``store`` on): the
    # next request names it again, or that part of the conversation would be lost.
    previous: str | None = None


class Socket:
    """One client's socket: its messages, one response at a time, and its context."""

    def __init__(
        self, websocket: WebSocket, gateway: Gateway, client_authorization: str | None
    ) -> None:
        self.websocket = websocket
        self.gateway = gateway
        self.client_authorization = client_authorization
        self.credential = credential(websocket)
        # What goes upstream with every response: the handshake's end-to-end headers,
        # but not the WebSocket's own (its key, version, extensions, the beta flag).
        self.headers = _forwarded(websocket.headers.items())
        # The handshake's query string goes with every leg, as a POST's does (api-version).
        self.query = run_query(websocket.scope["query_string"])
        self.trace = trace_context(websocket)
        self.context: Context | None = None
        self.opened = time.monotonic()
        self.channel = Channel(websocket, gateway.config.listen.send_timeout)
        # Counts and logs each response.create as a request (its app is never called:
        # a turn is not an ASGI request).
        self._observer = Observer(
            serve_socket, gateway.metrics, content=gateway.config.logging.content
        )

    async def serve(self) -> None:
        settings = self.gateway.config.websocket
        self.channel.start()
        try:
            await self._serve(settings.idle_timeout, settings.max_lifetime)
        except Gone:
            pass  # the client left, or stopped reading: its run goes on, detached
        finally:
            await self.channel.stop()

    async def _serve(self, idle_timeout: float, max_lifetime: float) -> None:
        while True:
            try:
                async with asyncio.timeout(idle_timeout):
                    message = await self.channel.next()
            except TimeoutError:
                await self.channel.close(1001, "idle")
                return
            if message is None:
                return  # the client left
            if time.monotonic() - self.opened > max_lifetime:
                await self.channel.error(
                    400,
                    "The WebSocket connection reached its maximum lifetime; "
                    "reconnect and send the whole input.",
                    "websocket_connection_limit_reached",
                )
                await self.channel.close(1000, "lifetime")
                return
            await self._message(message)

    # -- one message ----------------------------------------------------------------

    async def _message(self, raw: str | bytes) -> None:
        """Handle one client message; ``Gone`` once the client has left."""
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            await self.channel.error(400, "The message is not valid JSON.", "invalid_json")
            return
        if not isinstance(message, dict):
            await self.channel.error(400, "The message must be a JSON object.", "invalid_json")
            return
        kind = message.get("type")
        if kind != "response.create":
            await self.channel.error(
                400,
                f"Unsupported message type {kind!r}: this gateway serves 'response.create'.",
                "unsupported_event",
            )
            return
        if message.get("stream_id") is not None:
            await self.channel.error(
                400,
                "Named streams (stream_id) are not supported by this gateway: "
                "send one response at a time on the default lane.",
                "invalid_stream_id",
            )
            return
        await self._create(message)

    async def _create(self, message: dict[str, Any]) -> None:
        started = time.perf_counter()
        record = RequestLog("WS", PATH, started, "none")
        token = current.set(record)
        try:
            await self._respond(message, record)
        except Gone:
            record.disconnected = not record.complete
            raise
        finally:
            current.reset(token)
            self._observer.finish(record)

    async def _respond(self, message: dict[str, Any], record: RequestLog) -> None:
        gateway = self.gateway
        body = {k: v for k, v in message.items() if k not in TRANSPORT_FIELDS}
        try:
            body = await self._with_context(body)
            if message.get("generate") is False:
                await self._warm_up(body, record)
                return
            asked = routed(
                gateway,
                RESPONSES,
                body | {"stream": True},
                self.client_authorization,
                record.started,
                self.query,
                label=record,
            )
        except GatewayError as exc:
            record.status = exc.status_code
            await self.channel.send_error(exc.status_code, exc.body(), _retry_headers(exc))
            return
        await self._run(asked, record)

    async def _with_context(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with its ``previous_response_id`` expanded from what this socket saw,
        or checked as HTTP checks it (an upstream's stored response)."""
        previous = body.get("previous_response_id")
        if not isinstance(previous, str) or not previous:
            return body
        context = self.context
        if context is not None and context.response_id == previous:
            expanded = body | {"input": context.items + input_items(body)}
            expanded.pop("previous_response_id")
            if context.previous is not None:  # what it continued upstream, named again
                expanded["previous_response_id"] = context.previous
            return expanded
        if body.get("store") is False:
            raise InvalidRequest(
                f"Previous response {previous!r} is not on this connection, and with "
                "store: false it is kept nowhere else; send the whole input.",
                code="previous_response_not_found",
            )
        return await whole_context(self.gateway, body, previous, self.credential)

    async def _warm_up(self, body: dict[str, Any], record: RequestLog) -> None:
        """``generate: false``: a response with an id and no output, no model call; its
        input (instructions and tools are the next request's own) is kept as context."""
        response_id = "resp_" + os.urandom(16).hex()
        usage = ResponsesAccumulator().client_usage()  # zeros, with the details
        response = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata") or {},
            "model": body.get("model") or "",
            "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature"),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "usage": None,
        }
        record.status = 200
        for number, (kind, status) in enumerate(
            (
                ("response.created", "in_progress"),
                ("response.in_progress", "in_progress"),
                ("response.completed", "completed"),
            )
        ):
            shown = response | {"status": status}
            if status == "completed":
                shown["usage"] = usage
            record.sent += await self.channel.send(
                {"type": kind, "sequence_number": number, "response": shown}
            )
        record.complete = True
        self._keep(response_id, body, [])

    # -- one run --------------------------------------------------------------------

    async def _run(self, asked: Asked, record: RequestLog) -> None:
        gateway = self.gateway
        run, _ = new_run(asked, self.headers, self.trace)
        record.run = run
        try:
            with gateway.runs.in_progress():
                await run.open()
                local = gateway.runs.adopt(run, self.credential)
        except UpstreamHTTPError as exc:
            record.status = exc.status_code
            headers = {k.lower(): v for k, v in exc.headers if k.lower() in RETRY_HEADERS}
            if exc.status_code in RETRYABLE_STATUSES:  # the gateway retried it already
                headers |= NO_RETRY
            await self.channel.send_error(exc.status_code, _upstream_error(exc), headers)
            return
        except GatewayError as exc:
            record.status = exc.status_code
            await self.channel.send_error(exc.status_code, exc.body(), _retry_headers(exc))
            return
        record.status = 200
        ended = asyncio.Event()  # the terminal event went out: what comes next is a new turn
        relay = asyncio.create_task(
            self._relay(local.attach(0, ids=False), asked.body, record, ended)
        )
        try:
            await self._while_relaying(relay, ended)
        finally:
            if not relay.done():
                relay.cancel()  # the client left: the run goes on, detached
            with contextlib.suppress(asyncio.CancelledError, Gone):
                await relay

    async def _while_relaying(self, relay: asyncio.Task[None], ended: asyncio.Event) -> None:
        """Wait for ``relay``, answering messages meanwhile: a create before the terminal
        event is refused, one after it waits for its turn. ``Gone`` if the client left."""
        while not relay.done():
            incoming = asyncio.ensure_future(self.channel.next())
            await asyncio.wait({relay, incoming}, return_when=asyncio.FIRST_COMPLETED)
            if not incoming.done():
                incoming.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await incoming
                break
            message = incoming.result()
            if message is None:
                raise Gone
            if ended.is_set():
                self.channel.hold(message)  # the next turn: handled once this one is over
                continue
            await self.channel.error(
                400,
                "A response is already in progress on this connection; send the next "
                "response.create after its terminal event.",
                "response_in_progress",
            )
        relay.result()  # Gone, if the client left while it sent

    async def _relay(
        self,
        events: AsyncIterator[bytes],
        body: dict[str, Any],
        record: RequestLog,
        ended: asyncio.Event,
    ) -> None:
        """The run's events, one text frame each; the context kept at its end."""
        try:
            async for chunk in events:
                for event in split_events(chunk) if chunk.count(b"\n\n") > 1 else (chunk,):
                    if event.startswith(b":"):
                        continue  # an SSE keepalive: the socket has its own pings
                    data = event.partition(b"\ndata: ")[2].rstrip(b"\n")
                    await self.channel.send_frame(data.decode())
                    record.sent += len(data)
                    if event.startswith(ENDED):
                        record.complete = True
                        ended.set()
                        if event.startswith(TERMINAL):
                            self._ended(data, body)
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def _ended(self, data: bytes, body: dict[str, Any]) -> None:
        response = orjson.loads(data).get("response")
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            output = response.get("output")
            self._keep(response["id"], body, output if isinstance(output, list) else [])

    def _keep(self, response_id: str, body: dict[str, Any], output: list[Any]) -> None:
        """Keep what ``response_id`` stands for (the input ``body`` sent, its ``output``),
        if it fits ``max_context_bytes``."""
        items = input_items(body) + output
        size = len(orjson.dumps(items))
        if size > self.gateway.config.websocket.max_context_bytes:
            self.context = None
            logger.info(
                "websocket context not kept: larger than websocket.max_context_bytes",
                extra={"bytes": size},
            )
            return
        previous = body.get("previous_response_id")
        self.context = Context(
            response_id, items, size, previous if isinstance(previous, str) else None
        )


def _forwarded(headers: Any) -> list[tuple[str, str]]:
    """The handshake's headers that go upstream with every response: not the
    WebSocket's own (its key, version, extensions), nor its beta flag (the upstream
    is spoken to over HTTP); other ``openai-beta`` flags stay."""
    forwarded = []
    for name, value in headers:
        if name.startswith("sec-websocket-"):
            continue
        if name == "openai-beta":
            flags = [f.strip() for f in value.split(",") if "websockets" not in f]
            if not any(flags):
                continue
            value = ",".join(f for f in flags if f)
        forwarded.append((name, value))
    return forwarded


def _retry_headers(exc: GatewayError) -> dict[str, str]:
    """What the HTTP answer to ``exc`` would carry for a client's retry logic."""
    return dict(NO_RETRY) if isinstance(exc, UpstreamFailure) else {}


def _upstream_error(exc: UpstreamHTTPError) -> dict[str, Any]:
    """An upstream's error body, as its ``error`` object where it has one."""
    try:
        body = orjson.loads(exc.content)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body
    message = f"The upstream answered {exc.status_code}."
    return error_body(message, "upstream_error", str(exc.status_code))
