"""Where a run's next upstream request goes, and when: the leg-choice policy.

A route is a list of legs (an upstream and a model). A run starts on the first and
keeps to a leg while its retry budget lasts, backing off between attempts; then it
moves to the next leg, and past the last it gives up with the last error
(docs/recovery.md, "Retries and legs", "Circuit breaking")::

    error status 429/5xx, connect error ──► backoff (Retry-After, or exponential
                                             with jitter), same leg, up to retries
    first-byte timeout, too slow ─────────► next leg at once: waiting again only
                                             multiplies the wait
    the client's own request refused ─────► raised to the client, never retried
    refused continuation, context length ─► next leg (it may take it)
    an open circuit ──────────────────────► skipped, unless it is the last leg

Every attempt is counted (``gateway_upstream_attempts_total``) and tells its
upstream's circuit breaker what it says of the upstream's health. The run loop
(gateway/runs/run.py) asks; this module decides.
"""

from __future__ import annotations

import asyncio
import random

from gateway.errors import UpstreamFailure, UpstreamTimeout
from gateway.metrics import Metrics
from gateway.recovery.classify import (
    RETRYABLE_STATUSES,
    Cause,
    is_context_length_error,
    retry_after_seconds,
)
from gateway.upstream.breaker import CircuitBreakers
from gateway.upstream.client import UpstreamHTTPError
from gateway.upstream.routes import ResolvedLeg, ResolvedRoute


def attempt_result(exc: UpstreamFailure | UpstreamHTTPError) -> str:
    """How a failed open is counted: ``http_<status>``, ``first_byte_timeout`` or
    ``connect_error`` (``gateway_upstream_attempts_total{result}``)."""
    if isinstance(exc, UpstreamHTTPError):
        return f"http_{exc.status_code}"
    return "first_byte_timeout" if isinstance(exc, UpstreamTimeout) else "connect_error"


class Attempts:
    def __init__(self, route: ResolvedRoute, circuits: CircuitBreakers, metrics: Metrics) -> None:
        self.route = route
        self._circuits = circuits
        self._metrics = metrics
        self.index = 0  # of the leg in the route
        self.attempt = 0  # on the current leg
        self.last_delay = 0.0  # seconds the last backoff waited
        self.made = 0  # upstream requests made, over all legs

    @property
    def leg(self) -> ResolvedLeg:
        return self.route.legs[self.index]

    @property
    def on_last_leg(self) -> bool:
        return self.index + 1 >= len(self.route.legs)

    def restore(self, index: int) -> None:
        """Go on from the leg a checkpoint names (a takeover)."""
        self.index = min(index, len(self.route.legs) - 1)

    def allowed(self) -> bool:
        """Whether to try the current leg now: its upstream's circuit is closed or lets
        this run probe it, or it is the route's last leg, tried anyway rather than
        failing a run without a single attempt."""
        return self._circuits[self.leg.upstream.name].allows() or self.on_last_leg

    async def failed_open(self, exc: UpstreamFailure | UpstreamHTTPError, *, first: bool) -> None:
        """An attempt to open ``leg`` failed: wait and retry it, or move to the next leg.

        ``first``: the attempt carried the client's own request (not a continuation);
        its refusal is the client's answer and is raised as it is.
        """
        self.count(attempt_result(exc))
        if isinstance(exc, UpstreamHTTPError):
            if exc.status_code in RETRYABLE_STATUSES:
                await self.backoff(exc, retry_after=retry_after_seconds(exc.headers))
            elif first and not is_context_length_error(exc.content):
                raise exc  # the client's own request was refused: never retried
            else:
                # A larger-context leg, or a leg that rejected the continuation
                # (e.g. an assistant prefill): the next leg may do better.
                self.next_leg(exc)
        elif isinstance(exc, UpstreamTimeout):
            # Retrying a silent upstream only multiplies the wait: next leg at once.
            self.next_leg(exc)
        else:
            await self.backoff(exc)

    async def after_interruption(self, failure: UpstreamFailure, cause: Cause) -> None:
        """A stream broke: where (and after how long) its continuation is opened."""
        if cause in (Cause.FIRST_BYTE_TIMEOUT, Cause.SLOW):
            self.next_leg(failure)  # a silent or crawling leg again only multiplies the wait
        elif cause not in (Cause.REPLICA_LOST, Cause.DETACHED, Cause.DIVERGED):
            await self.backoff(failure, idle=cause is Cause.IDLE)

    async def backoff(
        self, last: Exception, *, retry_after: float | None = None, idle: bool = False
    ) -> None:
        """Wait before the next attempt on this leg, or move on once its budget is spent."""
        policy = self.route.retry
        if self.attempt >= policy.retries:
            self.next_leg(last)
            return
        self.attempt += 1
        if retry_after is not None:
            delay = min(retry_after, policy.retry_after_max)
        elif idle:
            delay = policy.idle_retry_delay
        else:
            ceiling = min(policy.backoff_max, policy.backoff_initial * 2 ** (self.attempt - 1))
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)  # jitter spreads retries
        self.last_delay = delay
        await asyncio.sleep(delay)  # a cancelled run ends here, at once

    def next_leg(self, last: Exception) -> None:
        """Move to the next leg; past the last, raise ``last``."""
        if self.on_last_leg:
            raise last
        self.index += 1
        self.attempt = 0
        self.last_delay = 0.0

    def count(self, result: str) -> None:
        """Count an attempt's ``result`` (``ok``, ``http_<status>``, ``connect_error``…),
        and tell its upstream's circuit breaker what it says about the upstream's health."""
        self.made += 1
        if result == "ok":
            self.last_delay = 0.0  # a later continuation without a backoff waits nothing
        leg = self.leg
        self._metrics.attempts.labels(leg.upstream.name, str(self.index), result).inc()
        circuit = self._circuits[leg.upstream.name]
        if result in ("connect_error", "first_byte_timeout") or result.startswith("http_5"):
            circuit.failed()
        elif result == "prefill_refused" or (result.startswith("http_4") and result != "http_429"):
            circuit.succeeded()  # up and judging requests; a 429 says nothing either way
        # ok: the stream may still break; its end decides (``stream_ended``).

    def stream_ended(self, *, healthy: bool) -> None:
        """The current leg's stream ended: whole (healthy), or broken by its upstream."""
        circuit = self._circuits[self.leg.upstream.name]
        if healthy:
            circuit.succeeded()
        else:
            circuit.failed()
