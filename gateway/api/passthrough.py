"""Everything under /v1 that is not a chat completion: relayed unchanged, streams streamed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.api.fields import without_gateway_fields
from gateway.context import Gateway, gateway_of
from gateway.errors import GatewayError, NotFound, UpstreamFailure, sse_error_event
from gateway.inbound import client_protocol
from gateway.upstream.headers import end_to_end_headers, forwarded_request_headers
from gateway.upstream.routes import ResolvedLeg
from gateway.upstream.target import relay_target

logger = logging.getLogger("gateway.passthrough")


def _upstream_target(request: Request) -> str:
    scope = request.scope
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8")
    return relay_target(raw_path, scope["query_string"])


async def _aiter_raw(response: httpx2.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx2.TransportError:
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            raise  # the connection is aborted: the client sees an incomplete body
        # An event stream that broke must not end like a complete one.
        yield sse_error_event(
            UpstreamFailure("The upstream stream broke mid-way.", code="upstream_interrupted")
        )


def upstream_error_response(
    status_code: int, headers: list[tuple[str, str]], content: bytes, **extra: str
) -> Response:
    """An upstream's error answer, read (so decoded) and scrubbed of upstream keys."""
    kept = {k: v for k, v in headers if k.lower() != "content-encoding"}
    return Response(content, status_code, headers=kept | extra)


async def relay(
    request: Request,
    gateway: Gateway,
    leg: ResolvedLeg,
    content: bytes,
    client_authorization: str | None,
    target: str | None = None,
) -> Response:
    upstream = leg.upstream
    if upstream.kind in ("bedrock", "vertex"):  # a cloud's one door: streamed answers
        raise NotFound(
            f"Upstream {upstream.name!r} (kind {upstream.kind}) serves streamed answers "
            f"only; {request.method} {request.url.path} goes to an anthropic, openai or "
            "gemini upstream (docs/providers.md)."
        )
    forwarded = forwarded_request_headers(
        request.headers.items(), credentials=gateway.auth.passes_credentials
    )
    headers = gateway.upstreams.request_headers(leg.upstream, forwarded, client_authorization)
    # The body is relayed as received: the upstream may compress it only if the client
    # said it can decode that (httpx2 would otherwise offer gzip on the client's behalf).
    headers.setdefault("accept-encoding", "identity")
    response = await gateway.upstreams.forward(
        leg, request.method, target or _upstream_target(request), headers, content
    )
    if response.status_code >= 400:
        return upstream_error_response(*await gateway.upstreams.read_error(response))
    return StreamingResponse(
        _aiter_raw(response),
        status_code=response.status_code,
        headers=dict(end_to_end_headers(response.headers.multi_items())),
        background=BackgroundTask(response.aclose),
    )


async def forward_json(
    request: Request,
    gateway: Gateway,
    leg: ResolvedLeg,
    body: dict[str, Any],
    client_authorization: str | None,
) -> Response:
    """Relay a JSON request with the leg's model name, and without gateway-only fields."""
    body = without_gateway_fields(body)
    if body.get("model") != leg.model:
        body = body | {"model": leg.model}
    return await relay(request, gateway, leg, orjson.dumps(body), client_authorization)


async def passthrough(request: Request) -> Response:
    """Any other /v1 path, routed by the body's ``model`` when there is one."""
    target = _upstream_target(request)  # before anything else: a bad path goes nowhere
    gateway = gateway_of(request)
    client_authorization = gateway.auth.authorize(request)
    content = await gateway.read_body(request)
    # An Anthropic client's requests (count_tokens, batches) go where its models do,
    # OpenAI's (embeddings, files) to an upstream that speaks OpenAI's.
    protocol = client_protocol(request)
    if content and "json" in request.headers.get("content-type", ""):
        try:
            parsed = orjson.loads(content)
        except orjson.JSONDecodeError:
            parsed = None  # the upstream judges its own input
        if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
            leg = gateway.router.resolve(parsed["model"], protocol).legs[0]
            return await forward_json(request, gateway, leg, parsed, client_authorization)
    leg = gateway.router.default_leg(protocol)
    return await relay(request, gateway, leg, content, client_authorization, target)


async def list_models(request: Request) -> Response:
    """The default upstream's models, plus every route that names a model exactly. An
    Anthropic or a Gemini client gets its upstream's list as it is (its SDK reads its
    API's shape)."""
    gateway = gateway_of(request)
    client_authorization = gateway.auth.authorize(request)
    protocol = client_protocol(request)
    if protocol in ("messages", "gemini"):  # their SDKs read their own list's shape
        leg = gateway.router.default_leg(protocol)
        return await relay(request, gateway, leg, b"", client_authorization)
    leg = gateway.router.default_leg("chat")
    forwarded = forwarded_request_headers(
        request.headers.items(), credentials=gateway.auth.passes_credentials
    )
    headers = gateway.upstreams.request_headers(leg.upstream, forwarded, client_authorization)
    headers["accept-encoding"] = "identity"  # the list is read here
    models: list[dict[str, Any]] = []
    try:
        response = await gateway.upstreams.forward(leg, "GET", "/models", headers, b"")
        if 400 <= response.status_code < 500:
            return upstream_error_response(*await gateway.upstreams.read_error(response))
        try:
            content = await response.aread()
        finally:
            await response.aclose()
        listed = orjson.loads(content).get("data") if response.status_code == 200 else None
        if isinstance(listed, list):
            models = [m for m in listed if isinstance(m, dict)]
    except (GatewayError, httpx2.TransportError, orjson.JSONDecodeError, AttributeError):
        logger.warning("could not list the models of upstream %r", leg.upstream.name)
    known = {m.get("id") for m in models}
    models += [
        {"id": name, "object": "model", "created": 0, "owned_by": "resumable-gateway"}
        for name in gateway.router.literal_models()
        if name not in known
    ]
    return JSONResponse({"object": "list", "data": models})
