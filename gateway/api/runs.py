"""Resuming a run: ``GET /v1/runs/{id}/events`` and the resume headers of chat completions.

Two doors to the same thing (README, "Resuming a stream"):

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

from collections.abc import AsyncIterator

from sse_starlette.sse import AppStatus, EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.context import Gateway, gateway_of
from gateway.errors import InvalidRequest
from gateway.observe import request_log

STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

# sse-starlette ends every EventSourceResponse as soon as uvicorn receives SIGTERM;
# the drain (Runs.drain) lets these streams finish and ends them itself.
AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]


def parse_offset(value: str | None, name: str) -> int:
    if value is None or value == "":
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise InvalidRequest(f"{name} must be a number of events received (got {value[:40]!r}).")
    return int(value)


async def _resume(
    request: Request, gateway: Gateway, run_id: str, after: int, *, ids: bool
) -> AsyncIterator[bytes] | None:
    forward = gateway.auth.authorize(request)
    log = request_log()
    log.route, log.resumed_from = "runs", after
    log.extra["run_id"] = run_id
    return await gateway.runs.resume(
        run_id,
        request.headers.get("authorization"),
        after,
        ids=ids,
        forward_authorization=forward,
    )


async def run_events(request: Request) -> Response:
    gateway = gateway_of(request)
    run_id = request.path_params["run_id"]
    header = request.headers.get("last-event-id")
    if header is not None:
        after = parse_offset(header.strip(), "Last-Event-ID")
    else:
        after = parse_offset(request.query_params.get("after"), "after")
    body = await _resume(request, gateway, run_id, after, ids=True)
    if body is None:
        return Response(status_code=204, headers={"x-run-id": run_id})
    # ping=0: a comment keepalive after an id: line breaks the openai SDK's decoder.
    return EventSourceResponse(
        body, ping=0, headers={"x-run-id": run_id, "cache-control": "no-cache"}
    )


async def resume_chat(request: Request, gateway: Gateway, run_id: str) -> Response:
    """``POST /v1/chat/completions`` carrying ``x-run-id``: the rest of that run's stream."""
    await gateway.read_body(request)  # same limits as any request; the body is not used
    after = parse_offset(request.headers.get("x-resume-from"), "x-resume-from")
    body = await _resume(request, gateway, run_id, after, ids=False)
    return StreamingResponse(
        body if body is not None else _empty(),
        media_type="text/event-stream",
        headers=STREAM_HEADERS | {"x-run-id": run_id},
    )


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""
