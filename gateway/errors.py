"""Errors the gateway answers with, and their OpenAI-shaped bodies.

Every error a client sees from the gateway itself has the body
``{"error": {"message": ..., "type": ..., "code": ...}}`` that OpenAI SDKs parse; on
``/v1/messages``, Anthropic's ``{"type": "error", "error": {"type": ..., "message": ...}}``
(with the same ``code``), its type named as Anthropic names that status; on Gemini's
paths, Google's ``{"error": {"code": <status>, "message": ..., "status": <name>}}``.
Errors from an upstream's own 4xx pass through unchanged and never come here.

The hierarchy::

    GatewayError                 status, type, code; .body() / .response()
    ├── InvalidRequest           400 invalid_request_error (bad JSON, bad fields)
    ├── Unauthorized             401 authentication_error (bad or missing gateway key)
    ├── NotFound                 404 invalid_request_error (unknown model, path, run)
    ├── Conflict                 409 conflict_error
    │   └── ResumeNotExact       (a resume position the store cannot place)
    ├── PayloadTooLarge          413 invalid_request_error
    ├── ServiceUnavailable       503 server_error (the checkpoint store, for a resume)
    └── UpstreamFailure          502 upstream_error (unreachable, broken, bad answer)
        └── UpstreamTimeout      504 upstream_error (no first byte in time)
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class GatewayError(Exception):
    status_code = 500
    error_type = "server_error"
    code: str | None = "internal_error"
    headers: dict[str, str] | None = None  # sent with the error's HTTP response

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.code)

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape (``/v1/messages``), which keeps OpenAI's members too."""
        kind = ANTHROPIC_TYPES.get(self.status_code, "api_error")
        return {"type": "error", "error": self.body()["error"] | {"type": kind}}

    def google_body(self) -> dict[str, Any]:
        """Google's shape (the Gemini API's paths): its status named as google.rpc does."""
        return google_error(self.status_code, self.message)

    def response(self, *, anthropic: bool = False, google: bool = False) -> Response:
        body = self.google_body() if google else self.anthropic_body() if anthropic else None
        return Response(
            orjson.dumps(body or self.body()),
            status_code=self.status_code,
            media_type="application/json",
            headers=self.headers,
        )


class InvalidRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(GatewayError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class NotFound(GatewayError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class Conflict(GatewayError):
    status_code = 409
    error_type = "conflict_error"
    code = "conflict"


class ResumeNotExact(Conflict):
    """The client holds events the store does not: its resume cannot be placed exactly.

    Never retried by the SDKs (``x-should-retry: false``): the same position fails
    the same way; the client asks again without ``x-run-id`` for a new answer.
    """

    code = "resume_not_exact"
    headers = {"x-should-retry": "false"}


class ServiceUnavailable(GatewayError):
    status_code = 503
    error_type = "server_error"
    code = "service_unavailable"


class ShuttingDown(ServiceUnavailable):
    code = "gateway_shutting_down"


class PayloadTooLarge(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UpstreamFailure(GatewayError):
    status_code = 502
    error_type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamFailure):
    status_code = 504
    code = "upstream_timeout"


# Anthropic's error types, by HTTP status (what the anthropic SDK's users see).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


# Google's status names (google.rpc.Code), by HTTP status.
GOOGLE_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def google_error(code: int, message: str) -> dict[str, Any]:
    return {
        "error": {"code": code, "message": message, "status": GOOGLE_STATUSES.get(code, "UNKNOWN")}
    }


def error_body(message: str, error_type: str, code: str | int | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def sse_error_event(error: GatewayError) -> bytes:
    """The in-band error event that ends a stream that cannot be completed.

    The openai SDK raises ``APIError`` when it decodes this, so a broken answer is
    never mistaken for a complete one (ARCHITECTURE.md section 2, item 6).
    """
    return b"data: " + orjson.dumps(error.body()) + b"\n\n"
