"""Reading what a client sent: bounded bodies, JSON, and the gateway key check."""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from starlette.requests import HTTPConnection, Request

from gateway.errors import InvalidRequest, PayloadTooLarge, Unauthorized

ANTHROPIC_PATH = "/v1/messages"


def speaks_anthropic(request: Request) -> bool:
    """Whether the client speaks the Messages API (so reads Anthropic-shaped errors)."""
    path: str = request.scope["path"]
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


GEMINI_VERSIONS = ("/v1beta/", "/v1alpha/")


def speaks_gemini(request: HTTPConnection) -> bool:
    """Whether the client speaks the Gemini API (so reads Google-shaped errors): a path
    under ``/v1beta`` or ``/v1alpha``, a model's method (``/v1/models/{m}:{method}``),
    or the ``x-goog-api-key`` its SDKs send."""
    path: str = request.scope["path"]
    if path.startswith(GEMINI_VERSIONS) or "x-goog-api-key" in request.headers:
        return True
    return path.startswith("/v1/models/") and ":" in path.rpartition("/")[2]


def client_protocol(request: Request) -> str:
    """The API family of a request that is not a model call of its own (pass-through,
    ``/v1/models``): ``messages`` from an Anthropic client (a ``/v1/messages/...`` path,
    or the ``anthropic-version`` header its SDKs always send), else ``chat``. It picks
    the upstream, so an Anthropic client's key never goes to an OpenAI upstream; a Gemini
    client's requests go to Gemini's."""
    if speaks_anthropic(request) or "anthropic-version" in request.headers:
        return "messages"
    if speaks_gemini(request):
        return "gemini"
    return "chat"


def credential(request: HTTPConnection) -> str | None:
    """The credential a client presented, which owns the runs it starts: its
    ``Authorization`` (the openai SDK), else its ``x-api-key`` (the anthropic SDK), else
    its ``x-goog-api-key`` (the Gemini SDKs; a ``?key=`` is moved there at the door)."""
    headers = request.headers
    return headers.get("authorization") or headers.get("x-api-key") or headers.get("x-goog-api-key")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def trace_context(request: HTTPConnection) -> dict[str, str]:
    """The client's W3C trace context (``traceparent``, and its ``tracestate``), if it
    sent one; a ``tracestate`` without a ``traceparent`` means nothing (W3C)."""
    headers = request.headers
    if "traceparent" not in headers:
        return {}
    return {name: headers[name] for name in ("traceparent", "tracestate") if name in headers}


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body exceeds the gateway's limit of {limit} bytes.")


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    return parse_json_object(await read_body(request, limit))


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON ({exc}).", code="invalid_json"
        ) from None
    if not isinstance(obj, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return obj


class ClientAuth:
    """Gateway keys, if configured; otherwise clients' credentials pass through.

    ``authorize`` returns the Authorization header to hand to upstreams that have
    no key of their own: the client's in pass-through mode, nothing otherwise.
    """

    def __init__(self, keys: list[bytes]) -> None:
        self._keys = keys

    @property
    def passes_credentials(self) -> bool:
        """Whether clients' own credentials may go upstream: the gateway has no keys."""
        return not self._keys

    def authorize(self, request: HTTPConnection) -> str | None:
        """A gateway key as ``Authorization: Bearer`` (the openai SDK), ``x-api-key``
        (the anthropic SDK) or ``x-goog-api-key`` (the Gemini SDKs)."""
        header = request.headers.get("authorization")
        if not self._keys:
            return header
        if header is not None:
            scheme, _, token = header.partition(" ")
            presented = token.strip().encode() if scheme.lower() == "bearer" else b""
        else:
            headers = request.headers
            presented = (headers.get("x-api-key") or headers.get("x-goog-api-key", "")).encode()
        # Compare against every key so the time taken does not say which matched.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        if not presented or not matched:
            raise Unauthorized("Incorrect or missing gateway API key.")
        return None
