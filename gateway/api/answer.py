"""A run's answer to its client: streamed as it is relayed, or assembled (any protocol)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from gateway.api.fields import apply_fallbacks, without_gateway_fields
from gateway.api.passthrough import upstream_error_response
from gateway.api.runs import RunStream, disconnected, resume_stream
from gateway.context import Gateway, gateway_of
from gateway.errors import GatewayError, UpstreamFailure
from gateway.inbound import (
    credential,
    parse_json_object,
    speaks_anthropic,
    speaks_gemini,
    trace_context,
)
from gateway.observe import CLIENT_CLOSED, RequestLog, request_log
from gateway.protocols import Adapter
from gateway.recovery.classify import RETRYABLE_STATUSES
from gateway.runs.run import Run
from gateway.upstream.client import UpstreamClient, UpstreamHTTPError
from gateway.upstream.routes import ResolvedRoute
from gateway.upstream.target import run_query

# On an error the gateway already retried: SDKs (openai, anthropic) that honour it do
# not retry on top, so a client's retries never multiply the gateway's (no storm).
NO_RETRY = {"x-should-retry": "false"}


@dataclass(slots=True)
class Asked:
    """A request for a new run, read and routed: what ``answer`` starts it from."""

    gateway: Gateway
    adapter: Adapter
    route: ResolvedRoute  # only legs that serve the adapter's protocol
    body: dict[str, Any]  # without the gateway's own fields
    client_authorization: str | None
    started: float
    query: str  # the client's query string as it goes upstream ("" or "?…": run_query)
    fallbacks: list[str] | None  # the request's own ``fallbacks`` (checked), if any


async def asked(
    request: Request,
    adapter: Adapter,
    shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Asked | Response:
    """Read and route a ``POST`` of ``adapter``'s API; the rest of a run if it names one
    (``x-run-id``: a resume, answered here). ``shape``: checks the body and adds what the
    door knows of it (Gemini's model and mode are in its path)."""
    started = time.perf_counter()
    gateway = gateway_of(request)
    client_authorization = gateway.auth.authorize(request)
    resumed = request.headers.get("x-run-id")
    query = run_query(request.scope["query_string"])
    label = request_log()
    if resumed is None:
        body = await gateway.read_json(request)
        body = shape(body) if shape is not None else body
        return routed(gateway, adapter, body, client_authorization, started, query, label=label)
    rest = await resume_stream(request, gateway, resumed)
    if isinstance(rest, Response):
        return rest
    # The client had none of the run: a new run of its request, if it makes one (else
    # the resume's own answer: it asked for a run).
    try:
        body = parse_json_object(rest.body)
        body = shape(body) if shape is not None else body
        new = routed(gateway, adapter, body, client_authorization, started, query, label=label)
    except GatewayError:
        raise rest.error from None
    label.resumed_from = None
    label.extra.pop("run_id", None)  # the new run's id goes in its line
    return new


def routed(
    gateway: Gateway,
    adapter: Adapter,
    body: dict[str, Any],
    client_authorization: str | None,
    started: float,
    query: str = "",
    *,
    label: RequestLog | None = None,
) -> Asked:
    """A request's body, routed to the legs that serve ``adapter``'s protocol; its
    route's name on ``label`` (the request's log line and metrics) once it resolved,
    before the request's own fallbacks are checked."""
    route = gateway.router.resolve(body.get("model"), adapter.name)
    if label is not None:
        label.route = route.name
    requested = body.get("fallbacks")
    route = apply_fallbacks(route, requested, gateway.router, adapter.name).serving(adapter.name)
    # A strict upstream refuses fields it does not know.
    body = without_gateway_fields(body)
    return Asked(gateway, adapter, route, body, client_authorization, started, query, requested)


def new_run(
    asked: Asked, headers: Iterable[tuple[str, str]], trace: dict[str, str]
) -> tuple[Run, UpstreamClient]:
    """The run ``asked`` for, with the client's forwardable ``headers`` going upstream
    on every leg (upstream/headers.py), traced under the client's ``trace`` context."""
    gateway, route, body = asked.gateway, asked.route, asked.body
    upstreams = gateway.upstreams.for_client(headers, credentials=gateway.auth.passes_credentials)
    run = Run(
        adapter=asked.adapter,
        route=route,
        body=body,
        client_authorization=asked.client_authorization,
        upstreams=upstreams,
        metrics=gateway.metrics,
        started=asked.started,
        query=asked.query,
        fallbacks=asked.fallbacks,
    )
    if gateway.tracing is not None:
        run.trace = gateway.tracing.run(
            protocol=asked.adapter.name,
            model=body.get("model"),
            route=route.name,
            run_id=run.id,
            stream=run.stream,
            provider=route.legs[0].upstream.kind,
            headers=trace,
        )
    return run, upstreams


async def answer(request: Request, asked: Asked) -> Response:
    """Start the run ``asked`` for and answer with it."""
    gateway = asked.gateway
    run, upstreams = new_run(asked, request.headers.items(), trace_context(request))
    request_log().run = run
    headers = {"x-run-id": run.id}
    try:
        if run.stream:
            with gateway.runs.in_progress():
                await run.open()
                # Relayed by its own task: the run outlives this connection (detach).
                local = gateway.runs.adopt(run, credential(request))
            body = local.attach(0, ids=False)
            return RunStream(body, _answer_headers(upstreams, headers), asked.adapter)
        assembled = await _complete(run, request.receive)
    except UpstreamHTTPError as exc:
        # The upstream's own 4xx/5xx before any stream: passed through unchanged, but
        # one the gateway retried (429/5xx, its Retry-After kept) is not to be retried.
        if exc.status_code in RETRYABLE_STATUSES:
            headers |= NO_RETRY
        return upstream_error_response(exc.status_code, exc.headers, exc.content, **headers)
    except GatewayError as exc:
        response = exc.response(anthropic=speaks_anthropic(request), google=speaks_gemini(request))
        response.headers.update(headers)
        if isinstance(exc, UpstreamFailure):  # 502/504 once every leg's budget is spent
            response.headers.update(NO_RETRY)
        return response
    if assembled is None:  # nobody is there to read it
        return Response(status_code=CLIENT_CLOSED, headers=headers)
    gateway.runs.aliases.assembled(run, credential(request), assembled)
    return Response(
        orjson.dumps(assembled),
        media_type="application/json",
        headers=_answer_headers(upstreams, headers),
    )


def _answer_headers(upstreams: UpstreamClient, headers: dict[str, str]) -> dict[str, str]:
    """The upstream's request metadata (x-request-id, rate limits…) and the gateway's own."""
    return (upstreams.answer_metadata or {}) | headers


async def _complete(run: Run, receive: Receive) -> dict[str, Any] | None:
    """Open and collect a non-streaming run; None if its client left first.

    Nothing reads the client's connection while it waits for its one body, so a task
    does: a disconnect cancels the run, which closes the upstream response at once
    (ARCHITECTURE.md section 3) instead of paying for an answer nobody will read.
    """
    handler = asyncio.current_task()
    assert handler is not None
    waiting = True

    def left(gone: asyncio.Future[None]) -> None:
        if waiting and not gone.cancelled() and gone.exception() is None:
            handler.cancel()

    gone = asyncio.ensure_future(disconnected(receive))
    gone.add_done_callback(left)
    try:
        await run.open()
        return await run.collect()
    except asyncio.CancelledError:
        if not gone.done() or gone.cancelled() or handler.uncancel() > 0:
            raise  # cancelled from outside, not by the client leaving
        run.outcome = run.outcome or "cancelled"  # it left while the run was opening
        return None
    finally:
        waiting = False
        gone.cancel()
