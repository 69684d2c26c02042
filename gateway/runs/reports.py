"""What a run says of itself: its metrics, its spans and the recovery log line
(ARCHITECTURE.md section 8). ``Reports`` is ``Run``'s base: the loop (``runs/run.py``)
calls these at its steps; none of them decides anything, and none runs per chunk but
``_first_token``, once."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError
from gateway.metrics import Metrics
from gateway.protocols.base import ClientStream
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.classify import Cause
from gateway.recovery.plan import CONTINUED, Plan
from gateway.runs.attempts import Attempts
from gateway.runs.strategies import Strategy
from gateway.upstream.client import UpstreamHTTPError
from gateway.upstream.routes import ResolvedLeg, ResolvedRoute

if TYPE_CHECKING:
    from gateway.tracing import RunTrace

logger = logging.getLogger("gateway.run")


class Reports:
    # The run's, set by ``Run.__init__``.
    id: str
    route: ResolvedRoute
    accumulator: RunAccumulator
    splicer: ClientStream
    attempts: Attempts
    trace: RunTrace | None
    outcome: str | None
    recoveries: int
    first_token_at: float | None
    _body: dict[str, Any]
    _metrics: Metrics
    _plans: list[Plan]
    _restored_legs: frozenset[int]
    _started: float
    _strategy: Strategy | None
    _prefilled: bool
    _awaiting_content: bool

    def end_trace(self, error: str | None = None, outcome: str | None = None) -> None:
        """End the run's span (once): what it answered, cost and took."""
        trace = self.trace
        if trace is None or trace.ended:
            return
        accumulator = self.accumulator
        try:
            trace.content(self._body, accumulator.text)
            usage = accumulator.usage
        except Exception:  # noqa: BLE001 - a span is never worth the run's close
            logger.exception("tracing: the run's answer could not be read")
            usage = None
        trace.end(
            outcome=outcome or self.outcome,
            identity=accumulator.identity,
            finish_reason=accumulator.finish_reason,
            usage=usage,
            attempts=self.attempts.made,
            recoveries=self.recoveries,
            legs=self.splicer.leg + 1,
            seams=self.splicer.seam_outcomes(),
            error=error,
        )

    def _trace_attempt(self, trace: RunTrace, leg: ResolvedLeg) -> dict[str, str]:
        """Start the span of the request about to go to ``leg``: its headers."""
        plan = None if self._strategy is None else self._strategy.plan
        continued = plan in CONTINUED
        return trace.attempt(
            leg,
            index=self.attempts.index,
            attempt=self.attempts.attempt,
            plan="none" if plan is None else plan.value,
            mode=("prefill" if self._prefilled else "prompt") if continued else None,
            delay=self.attempts.last_delay,
            seams=len(self.splicer.seam_outcomes()),
        )

    def _trace_leg_ended(self) -> None:
        """The open leg's span ends: with what it cost (reported, else estimated)."""
        if self.trace is None:
            return
        leg, accumulator = self.splicer.leg, self.accumulator
        estimated = accumulator.estimated_by_leg.get(leg)
        usage = estimated if estimated is not None else accumulator.usage_by_leg.get(leg)
        self.trace.leg_ended(usage, estimated is not None, self.splicer.seam_outcomes())

    def _first_token(self) -> None:
        self._awaiting_content = False
        self.first_token_at = time.perf_counter()
        self._metrics.ttft.labels(self.route.name).observe(self.first_token_at - self._started)
        if self.trace is not None:
            self.trace.first_token(self.first_token_at - self._started)

    def _count_tokens(self) -> None:
        """Tokens by leg, reported apart from estimated (``gateway.recovery.usage``)."""
        estimated = self.accumulator.estimated_by_leg
        for source, by_leg in (
            ("reported", self.accumulator.usage_by_leg),
            ("estimated", estimated),
        ):
            for leg, usage in by_leg.items():
                if leg in self._restored_legs or (source == "reported" and leg in estimated):
                    continue
                # Chat's names, or the Responses and Messages ones.
                for kind, other in (("prompt", "input"), ("completion", "output")):
                    tokens = usage.get(f"{kind}_tokens", usage.get(f"{other}_tokens"))
                    if isinstance(tokens, int) and tokens > 0:
                        self._metrics.tokens.labels(kind, str(leg), source).inc(tokens)

    def _count_recoveries(self, outcome: str) -> None:
        for plan in self._plans:
            self._metrics.recoveries.labels(plan.value, outcome).inc()
        self._plans.clear()
        if self.splicer.trimmed:
            self._metrics.seam_trimmed.inc(self.splicer.trimmed)
        for cut in self.splicer.seam_outcomes():
            self._metrics.seams.labels(cut).inc()

    def _log_recovery(self, cause: Cause, plan: Plan) -> None:
        if self.trace is not None:
            chars = self.accumulator.text_chars
            self.trace.recovery(plan.value, cause.value, chars)
        logger.info(
            "recovery",
            extra={
                "run_id": self.id,
                "cause": cause.value,
                "plan": plan.value,
                "attempt": self.attempts.attempt,
                "leg": self.attempts.index,
                "upstream": self.attempts.leg.upstream.name,
                "delay_s": round(self.attempts.last_delay, 3),
                "sent_chars": self.accumulator.text_chars,
            },
        )


def error_type(exc: BaseException) -> str:
    """What a span's ``error.type`` says of an exception: the gateway's error code, the
    upstream's status, or the exception's class."""
    if isinstance(exc, UpstreamHTTPError):
        return str(exc.status_code)
    if isinstance(exc, GatewayError):
        return exc.code or type(exc).__name__
    return "cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__
