"""Failure classification (ARCHITECTURE.md section 3): what broke, in words metrics can count.

Pure: it looks at exceptions, events and requests (a reasoning request's idle doubles),
it never retries or sleeps.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import httpx2


class Cause(enum.StrEnum):
    CONNECT = "connect"  # refused, DNS, TLS: nothing reached the upstream
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    RESET = "reset"  # ECONNRESET mid-stream
    PROTOCOL = "protocol"  # incomplete chunked read, server disconnected, GOAWAY
    IDLE = "idle"  # no byte for idle_timeout after the stream started
    IN_BAND_ERROR = "in_band_error"
    TRUNCATED = "truncated"  # clean end of body with no finish_reason
    SLOW = "slow"  # below the route's min_throughput: the next leg at once
    REPLICA_LOST = "replica_lost"  # the gateway replica relaying the run died (crash resume)
    DETACHED = "detached"  # the run was stopped while no client listened; resumed later
    # A continuation's reply did not do as asked (no anchor, no restart), or a verified
    # replay did not begin with what the client has: never shown (ARCHITECTURE.md 6b).
    DIVERGED = "diverged"


def classify_transport_error(exc: BaseException) -> Cause:
    """Map an httpx2 error raised while waiting for or reading a response."""
    if isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout | httpx2.PoolTimeout):
        return Cause.CONNECT
    if isinstance(exc, httpx2.ProxyError):  # the proxy refused the tunnel (403, 407…)
        return Cause.CONNECT
    if isinstance(exc, httpx2.ReadTimeout):
        return Cause.IDLE
    if isinstance(exc, httpx2.ReadError | httpx2.WriteError):
        return Cause.RESET
    return Cause.PROTOCOL


DESCRIPTIONS = {
    Cause.CONNECT: "could not be reached",
    Cause.FIRST_BYTE_TIMEOUT: "sent nothing within its first-byte timeout",
    Cause.RESET: "reset the connection mid-stream",
    Cause.PROTOCOL: "broke the HTTP stream mid-way",
    Cause.IDLE: "stalled mid-stream (idle timeout)",
    Cause.IN_BAND_ERROR: "sent an error event",
    Cause.TRUNCATED: "ended the stream without a finish_reason",
    Cause.SLOW: "streamed below the minimum throughput",
    Cause.REPLICA_LOST: "was being relayed by a gateway replica that stopped",
    Cause.DETACHED: "was stopped while no client was listening",
    Cause.DIVERGED: "answered the continuation with text that does not follow the answer",
}


RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
_TRANSIENT_WORDS = (
    "overload",  # Anthropic's overloaded_error
    "api_error",  # Anthropic's unexpected server error
    "server_error",
    "server error",
    "internal",
    "timeout",
    "timed out",
    "temporar",
    "unavailable",
    "connection",
    "rate limit",
    "try again",
    "throttl",  # Bedrock's throttlingException
)


def is_transient_error(error: dict[str, object]) -> bool:
    """Whether an in-band error is worth recovering from (else it is surfaced)."""
    code = error.get("code")
    if isinstance(code, int) or (isinstance(code, str) and code.isdigit()):
        status = int(code)
        return status >= 500 or status == 429
    text = f"{code} {error.get('type')} {error.get('message')}".lower()
    return any(word in text for word in _TRANSIENT_WORDS)


def is_context_length_error(content: bytes) -> bool:
    """A request over the model's context: OpenAI's code, or Anthropic's words."""
    return b"context_length_exceeded" in content or b"prompt is too long" in content


def retry_after_seconds(headers: list[tuple[str, str]]) -> float | None:
    """The delay an upstream asked for in ``Retry-After`` (seconds form), if any."""
    for name, value in headers:
        if name.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None  # an HTTP date: rare from LLM APIs; fall back to backoff
    return None


_REASONING_MODEL = re.compile(r"(?:^|[^a-z0-9])o[134](?:$|[^0-9])|thinking|reasoning")


def is_reasoning_request(body: dict[str, Any], model: str) -> bool:
    """Reasoning models think silently for long stretches: their idle timeout doubles
    until they answer (``gateway.runs.run.Run._relay``). So do requests that ask for it:
    ``reasoning_effort`` (chat), ``reasoning`` (Responses), ``thinking`` on (Messages),
    a ``thinkingConfig`` (Gemini)."""
    if body.get("reasoning_effort") is not None or body.get("reasoning") is not None:
        return True
    config = body.get("generationConfig")
    if isinstance(config, dict) and isinstance(config.get("thinkingConfig"), dict):
        return True
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        return True
    return bool(_REASONING_MODEL.search(model.lower()))
