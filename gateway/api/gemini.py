"""The Gemini API: ``POST /{v1,v1beta,v1alpha}/models/{model}:streamGenerateContent`` and
``:generateContent`` (ARCHITECTURE.md section 2b); its other methods and its model list
passed through.

A run like any other (streamed or assembled, recovered the same way) on the legs of
its route whose upstream serves Gemini (``kind: gemini``, or ``vertex`` with
``protocols: [gemini]``). The model is the path's; the version is the upstream's own
(its ``base_url``), whichever the client named: the Gemini SDKs default to ``v1beta``
(Python: ``v1`` on some versions), and every version serves these methods.

The client's key comes in ``x-goog-api-key`` (the SDKs), ``?key=`` or ``Authorization:
Bearer``; a ``?key=`` is moved into ``x-goog-api-key`` before anything reads the
request, so it never travels in a query string upstream nor into a run's record. A
gateway key is accepted the same three ways. ``x-run-id`` + ``x-resume-from`` resume a
run as on the other doors. Errors from the gateway itself are Google-shaped here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.api.answer import answer, asked
from gateway.api.passthrough import relay
from gateway.context import gateway_of
from gateway.errors import InvalidRequest, NotFound
from gateway.protocols import GEMINI
from gateway.upstream.target import relay_query

VERSIONS = ("v1", "v1beta", "v1alpha")
# Where a POST names a model and a method: the app serves these without the router.
GEMINI_MODELS = tuple(f"/{version}/models/" for version in VERSIONS)
STREAM, GENERATE = "streamGenerateContent", "generateContent"


def key_to_header(request: Request) -> None:
    """Move a ``?key=`` into ``x-goog-api-key`` (unless the client sent that header too),
    before the request's headers are first read."""
    scope = request.scope
    query = scope["query_string"]
    if b"key=" not in query:
        return
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    keys = [value for name, value in pairs if name == "key"]
    if not keys:
        return
    scope["query_string"] = urlencode([(n, v) for n, v in pairs if n != "key"]).encode()
    headers = scope["headers"]
    if not any(name == b"x-goog-api-key" for name, _ in headers):
        scope["headers"] = [*headers, (b"x-goog-api-key", keys[0].encode("latin-1"))]


async def model_method(request: Request) -> Response:
    """``POST /{version}/models/{model}:{method}`` (routed, or straight from the app for
    less per streamed chunk: ``GatewayApp``): the model is the path's last segment."""
    key_to_header(request)
    target = request.scope["path"].rpartition("/models/")[2]
    if "/" in target:
        raise NotFound(f"Unknown path {request.url.path}.")
    model, _, method = target.rpartition(":")
    if method in (STREAM, GENERATE) and model:
        return await _generate(request, model, stream=method == STREAM)
    return await _pass(request, model, method)


async def _generate(request: Request, model: str, *, stream: bool) -> Response:
    if stream and request.query_params.get("alt") != "sse":
        raise InvalidRequest(
            "The gateway streams Gemini answers as server-sent events: add ?alt=sse "
            "(the Gemini SDKs always do)."
        )

    def shape(body: dict[str, Any]) -> dict[str, Any]:
        config = body.get("generationConfig")
        count = config.get("candidateCount") if isinstance(config, dict) else None
        if count not in (None, 1):
            raise InvalidRequest("The gateway serves one candidate per answer (candidateCount 1).")
        # The door's model and mode, read by the run as any protocol's (``routed``);
        # the provider takes them out of the body it sends (the model goes in its path).
        return body | {"model": model, "stream": stream}

    new = await asked(request, GEMINI, shape)
    if isinstance(new, Response):
        return new  # a resume
    return await answer(request, new)


async def _pass(request: Request, model: str, method: str) -> Response:
    """Another method on a model (``countTokens``, ``embedContent``…): to the first leg of
    the model's route, with the leg's model name."""
    gateway = gateway_of(request)
    client_authorization = gateway.auth.authorize(request)
    if not model or not method:
        raise NotFound(f"Unknown path {request.url.path}.")
    content = await gateway.read_body(request)
    leg = gateway.router.resolve(model, GEMINI.name).serving(GEMINI.name).legs[0]
    target = f"/models/{leg.model}:{method}" + relay_query(request.scope["query_string"])
    return await relay(request, gateway, leg, content, client_authorization, target)


async def list_models(request: Request) -> Response:
    """``GET /{version}/models`` (and one model): the default Gemini upstream's, as it is."""
    key_to_header(request)
    gateway = gateway_of(request)
    client_authorization = gateway.auth.authorize(request)
    leg = gateway.router.default_leg(GEMINI.name)
    name = request.path_params.get("target")
    target = "/models" + (f"/{name}" if name else "")
    target += relay_query(request.scope["query_string"])
    return await relay(request, gateway, leg, b"", client_authorization, target)


def gemini_routes() -> list[BaseRoute]:
    """The Gemini API's paths. ``GET /v1/models[/…]`` is OpenAI's too: there the
    pass-through tells a Gemini client by its key header (``inbound.client_protocol``)."""
    routes: list[BaseRoute] = []
    for version in VERSIONS:
        routes.append(Route(f"/{version}/models/{{target}}", model_method, methods=["POST"]))
        if version != "v1":
            routes += [
                Route(f"/{version}/models", list_models, methods=["GET"]),
                Route(f"/{version}/models/{{target}}", list_models, methods=["GET"]),
            ]
    return routes
