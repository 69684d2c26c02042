"""Resuming a run: ``GET /v1/runs/{id}/events`` and the resume headers of chat completions.

Two doors to the same thing (docs/durable-runs.md, "Resuming a stream"):

- ``GET /v1/runs/{run_id}/events`` for EventSource-style clients: every event
  carries ``id: N`` (its number in the run), and ``Last-Event-ID: N`` (or
  ``?after=N``) says what the client already has. No comment keepalives are ever
  sent on this stream (ARCHITECTURE.md section 2, item 7). A run already
  complete with nothing left to send answers 204, which tells an EventSource to
  stop reconnecting.
- ``POST /v1/chat/completions`` with ``x-run-id: RUN`` and ``x-resume-from: N``
  (the number of chunks already received) for OpenAI-SDK clients: the same
  call again, with two extra headers; the body is not used.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import NamedTuple

from sse_starlette.sse import AppStatus, EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.context import Gateway, gateway_of
from gateway.errors import InvalidRequest, NotFound, ServiceUnavailable
from gateway.inbound import credential, speaks_gemini, trace_context
from gateway.observe import ObservedSend, request_log
from gateway.protocols import GEMINI, Adapter
from gateway.runs.resume import Forwarding

STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

# sse-starlette ends every EventSourceResponse as soon as uvicorn receives SIGTERM;
# the drain (Runs.drain) lets these streams finish and ends them itself.
AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]


class RunStream(Response):
    """A chat run's SSE body, sent as the run's log grows, until it ends or the client leaves.

    What Starlette's StreamingResponse does, for less per stream: uvicorn speaks
    ASGI 2.3, where a send after a disconnect is dropped silently, so
    StreamingResponse runs the body in an anyio task group beside a second task
    that waits for the disconnect. Here that wait is one asyncio task whose end
    cancels the sender. Leaving closes the body at once, which detaches the
    follower from its run (the run goes on, for a reconnect to find).

    ``adapter``: the run's protocol, where its final error is written on its own,
    ``error_pause`` after the events before it (Gemini's JS SDK raises only on an error
    it reads alone): checked in the send loop, not by one more generator per chunk.
    """

    media_type = "text/event-stream"

    def __init__(
        self, body: AsyncIterator[bytes], headers: Mapping[str, str], adapter: Adapter | None = None
    ) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.init_headers(STREAM_HEADERS | dict(headers))
        self._apart = adapter if adapter is not None and adapter.error_pause else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.current_task()
        assert sender is not None
        finished = False

        def left(_: object) -> None:
            if not finished:
                sender.cancel()

        gone = asyncio.ensure_future(disconnected(receive))
        gone.add_done_callback(left)
        body = self.body_iterator
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if self._apart is not None:
                await _errors_apart(body, send, self._apart)
            elif type(send) is ObservedSend:  # each chunk noted here, sent with one call less
                raw, sent = send.raw, send.sent
                async for chunk in body:
                    sent(len(chunk))
                    await raw({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                async for chunk in body:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone.done() or gone.cancelled() or sender.uncancel() > 0:
                raise  # cancelled from outside, not by the client leaving
        finally:
            finished = True
            gone.cancel()
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone (after its request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def parse_offset(value: str | None, name: str) -> int:
    if value is None or value == "":
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise InvalidRequest(f"{name} must be a number of events received (got {value[:40]!r}).")
    return int(value)


async def resume_run(
    request: Request, gateway: Gateway, run_id: str, after: int, *, ids: bool
) -> AsyncIterator[bytes] | None:
    authorization = gateway.auth.authorize(request)
    log = request_log()
    log.route, log.resumed_from = "runs", after
    log.extra["run_id"] = run_id
    if request.method == "HEAD":  # a safe method: is the run there for this client? Never
        await gateway.resumes.check(run_id, credential(request))  # a claim or a follower
        return no_events()
    # Should this replica take the run over, its upstream requests carry this client's
    # headers, as the run's first request carried them (api/answer.py).
    upstreams = gateway.upstreams.for_client(
        request.headers.items(), credentials=gateway.auth.passes_credentials
    )
    return await gateway.resumes.resume(
        run_id,
        credential(request),
        after,
        ids=ids,
        forwarding=Forwarding(upstreams, authorization, trace_context(request)),
    )


async def run_events(request: Request) -> Response:
    gateway = gateway_of(request)
    run_id = request.path_params["run_id"]
    header = request.headers.get("last-event-id")
    if header is not None:
        after = parse_offset(header.strip(), "Last-Event-ID")
    else:
        after = parse_offset(request.query_params.get("after"), "after")
    body = await resume_run(request, gateway, run_id, after, ids=True)
    if body is None:
        return Response(status_code=204, headers={"x-run-id": run_id})
    # ping=0: a comment keepalive after an id: line breaks the openai SDK's decoder.
    return EventSourceResponse(
        body, ping=0, headers={"x-run-id": run_id, "cache-control": "no-cache"}
    )


class Fresh(NamedTuple):
    """A resume from nothing of a run that cannot be resumed here: the request's body, for
    a new run of it (a client that holds nothing loses nothing to a fresh answer), and
    the resume's own error, the answer should the body make no run."""

    body: bytes
    error: Exception


async def resume_stream(request: Request, gateway: Gateway, run_id: str) -> Response | Fresh:
    """A ``POST`` (chat completions, responses, messages, Gemini) carrying ``x-run-id``:
    the rest of that run; or, when the client has none of it (``x-resume-from: 0``) and
    the run is not there for it (unknown, expired, the store unavailable), ``Fresh``."""
    raw = await gateway.read_body(request)  # same limits as any request
    after = parse_offset(request.headers.get("x-resume-from"), "x-resume-from")
    try:
        body = await resume_run(request, gateway, run_id, after, ids=False)
    except (NotFound, ServiceUnavailable) as exc:
        if after or not raw:
            raise
        return Fresh(raw, exc)
    adapter = GEMINI if speaks_gemini(request) else None
    return RunStream(body if body is not None else no_events(), {"x-run-id": run_id}, adapter)


async def _errors_apart(body: AsyncIterator[bytes], send: Send, adapter: Adapter) -> None:
    """Send ``body``, a final error event on its own, ``adapter.error_pause`` after the
    events before it (``RunStream``)."""
    async for chunk in body:
        head, _, last = chunk[:-2].rpartition(b"\n\n")
        error = last + b"\n\n"
        if adapter.is_terminal(error) and not adapter.succeeded(error):
            if head:
                await send(
                    {"type": "http.response.body", "body": head + b"\n\n", "more_body": True}
                )
            await asyncio.sleep(adapter.error_pause)
            chunk = error
        await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def no_events() -> AsyncIterator[bytes]:
    return
    yield b""
