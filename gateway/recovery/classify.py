"""Failure classification (ARCHITECTURE.md section 3): what broke, in words metrics can count.

Pure: it looks at exceptions and events, it never retries or sleeps.
"""

from __future__ import annotations

import enum

import httpx


class Cause(enum.StrEnum):
    CONNECT = "connect"  # refused, DNS, TLS: nothing reached the upstream
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    RESET = "reset"  # ECONNRESET mid-stream
    PROTOCOL = "protocol"  # incomplete chunked read, server disconnected, GOAWAY
    IDLE = "idle"  # no byte for idle_timeout after the stream started
    IN_BAND_ERROR = "in_band_error"
    TRUNCATED = "truncated"  # clean end of body with no finish_reason


def classify_transport_error(exc: BaseException) -> Cause:
    """Map an httpx error raised while waiting for or reading a response."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Cause.CONNECT
    if isinstance(exc, httpx.ReadTimeout):
        return Cause.IDLE
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
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
}
