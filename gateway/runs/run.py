"""One run: attempts over legs, and recovery when a stream breaks, for any protocol.

The loop (ARCHITECTURE.md sections 3 and 4)::

    open:    leg 0, attempt 0 ── error status / connect error / first-byte timeout ──┐
               │ headers                     retry with backoff, then the next leg ◄┘
    relay:   chunks ──► Splicer ──► client bytes
               │ interruption (reset, stall, GOAWAY, in-band error, truncated end, too slow)
    recover: plan from what the client has ──► Reattach: the leg's own background
               │                                    response read again, same leg
               │                             ──► SynthesizeToolUse / FinishAtBudget:
               │                                    finish, no upstream call
               │ WholeRestart / ContinueText / TruncateBeforeTool / VerifiedReplay
             backoff (~200 ms after a stall), open the continuation on this leg, or on
             the next once this leg's budget is spent ──► relay again (same client stream)

Errors before the client stream started are HTTP errors (``open``); after it, the
stream ends with the protocol's in-band error (section 2 item 6, section 2a).

The loop knows its protocol (chat completions, Responses, Messages) only through
its ``Adapter`` (``gateway.protocols``): decoding, the splicer, request bodies. Which
leg each attempt goes to, and when (retries, backoff, fallbacks, circuits), is
``Attempts``'s to decide (gateway/runs/attempts.py); what a plan sends, and whether its
answer's seam is verified (a reply that does not follow is never shown:
``SeamDiverged``), its strategy's (gateway/runs/strategies/).

Hot path (per chunk): one orjson parse, the splicer's dict lookups, and the
received bytes forwarded when nothing needs rewriting; with a ``min_throughput``, a
character count and a clock read against a deadline (recovery/throughput.py). No logging.
The client's events are pushed into an ``Emit`` callback, not yielded: one loop reads
the upstream body, decodes, splices and hands the bytes on, where a chain of async
generators (body, SSE, relay, run) cost more per delta than all of that together
(BENCHMARKS.md, "512 streams").

Past 450 lines on purpose: ``Run`` is one state machine (open, relay, recover) whose
steps share the open response, the plan and the splicer; what is not that machine
went out already (leg choice: ``attempts.py``; the log and its followers: ``log.py``;
what each plan sends: ``strategies/``; background responses: ``background.py`` and a
takeover's check of one, ``catchup.py``; its metrics, spans and log line: ``reports.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import httpx2
import orjson

from gateway.errors import GatewayError, UpstreamFailure
from gateway.metrics import Metrics
from gateway.protocols.base import Adapter
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.classify import (
    DESCRIPTIONS,
    Cause,
    classify_transport_error,
    is_context_length_error,
    is_reasoning_request,
    is_transient_error,
)
from gateway.recovery.events import Chunk, Done, InBandError, Malformed
from gateway.recovery.plan import CONTINUED, Plan, Position, plan_recovery
from gateway.recovery.seam import SeamDiverged, SeamRule
from gateway.recovery.throughput import ThroughputGuard
from gateway.runs.attempts import Attempts, attempt_result
from gateway.runs.background import REATTACHABLE, Background
from gateway.runs.catchup import CatchUp, Emit, Restored
from gateway.runs.reports import Reports, error_type
from gateway.runs.strategies import Ask, Need, Strategy, strategy_for
from gateway.upstream.client import UpstreamClient, UpstreamHTTPError
from gateway.upstream.connection import set_read_timeout, whole
from gateway.upstream.continuation import REPLAY
from gateway.upstream.routes import ResolvedLeg, ResolvedRoute
from gateway.upstream.sse import event_stream

if TYPE_CHECKING:
    from gateway.tracing import RunTrace

logger = logging.getLogger("gateway.run")

DRAIN_TIMEOUT = 0.05  # an upstream ends its body right after [DONE], or not at all


def _discard(data: bytes) -> None:
    return None


async def _drain(rest: AsyncIterator[bytes]) -> None:
    """Read what follows [DONE] (the end of the chunked body, usually in the same packet)."""
    with contextlib.suppress(Exception):  # TimeoutError included
        async with asyncio.timeout(DRAIN_TIMEOUT):
            async for _ in rest:
                pass


class StreamInterrupted(UpstreamFailure):
    code = "upstream_interrupted"

    def __init__(self, message: str, cause: Cause, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.cause = cause
        self.fatal = fatal


class Run(Reports):
    def __init__(
        self,
        *,
        run_id: str | None = None,
        adapter: Adapter,
        route: ResolvedRoute,
        body: dict[str, Any],
        client_authorization: str | None,
        upstreams: UpstreamClient,
        metrics: Metrics,
        started: float | None = None,
        query: str = "",
        fallbacks: list[str] | None = None,
    ) -> None:
        self.id = run_id or os.urandom(16).hex()  # as random as uuid4().hex, 4x cheaper
        self.adapter = adapter
        self.route = route
        self.stream = bool(body.get("stream"))
        self.accumulator = adapter.new_accumulator()
        self.splicer = adapter.splicer(self.accumulator, body)
        self._body = body
        # The client's query string (``?beta=true``), checked, credentials left out
        # (``run_query``): every leg and continuation goes to the adapter's path with it.
        self.query = query
        self.fallbacks = fallbacks  # the request's own (``route`` has them): for a takeover
        self._path = adapter.path + query
        self._client_authorization = client_authorization
        self._upstreams = upstreams
        self._metrics = metrics
        self._started = time.perf_counter() if started is None else started
        self.attempts = Attempts(route, upstreams.circuits, metrics)  # which leg, when
        self._strategy: Strategy | None = None  # None: the original request
        self._plans: list[Plan] = []
        self._response: httpx2.Response | None = None
        # The rest of a response whose [DONE] arrived: read to its end before closing,
        # so its connection goes back to the pool instead of being torn down.
        self._after_done: AsyncIterator[bytes] | None = None
        self._first_event_deadline = 0.0
        self._request_bytes = 0  # of the open attempt's request (a usage estimate's input)
        self._restored_legs: frozenset[int] = frozenset()  # usage another replica counted
        self.recoveries = 0  # recovery plans carried out
        self.first_token_at: float | None = None  # perf_counter of the first content sent
        self.outcome: str | None = None  # done, failed or detached, once it ended
        self.last_cause: Cause | None = None
        self._seam: SeamRule | None = None  # what the open continuation repeats first
        self._awaiting_content = True  # no content sent yet: the next is the first token
        self._prefilled = False  # the open request ends with an assistant message
        # Its background responses: asked, read again, cancelled (gateway/runs/background.py).
        self.background = Background(
            self.id,
            upstreams,
            metrics,
            client_authorization,
            client_asked=body.get("background") is True,
        )
        # A takeover's: the first leg's background response, and the client's events,
        # to read it again from its start and check it against (``_read_again``).
        self._restored_background: str | None = None
        self._restored_events: list[bytes] = []
        # Called when an upstream stream broke, before recovery: a checkpoint is due.
        self.on_interrupted: Callable[[], None] | None = None
        self.trace: RunTrace | None = None  # its spans, when the gateway traces

    @property
    def _continuing(self) -> bool:
        """Whether the open plan continues the text (a continuation request, or a
        replay on a leg set to replay)."""
        return self._strategy is not None and self._strategy.plan in CONTINUED

    @property
    def leg(self) -> ResolvedLeg:
        return self.attempts.leg

    @property
    def body(self) -> dict[str, Any]:
        """The client's request (credentials are in headers, never here)."""
        return self._body

    @property
    def leg_index(self) -> int:
        return self.attempts.index

    def restore(
        self,
        accumulator: RunAccumulator,
        *,
        leg: int,
        splice_leg: int,
        in_flight: list[str],
        background: str | None = None,
        events: list[bytes] | None = None,
    ) -> None:
        """Take over a run from a checkpoint: what the client was sent, and where it was.
        ``background``: its first leg's upstream response, still generating when the
        checkpoint was written, and ``events`` the client's: read again before any plan."""
        if background is not None and splice_leg == 0 and events is not None:
            self._restored_background, self._restored_events = background, events
        self.accumulator = accumulator
        self.splicer = self.adapter.splicer(accumulator, self._body)
        self._restored_legs = frozenset(accumulator.usage_by_leg) | frozenset(
            accumulator.estimated_by_leg
        )
        self.splicer.restore(splice_leg, in_flight)
        self.attempts.restore(leg)

    # -- opening an attempt ---------------------------------------------------------

    def request_body(self, leg: ResolvedLeg) -> bytes | None:
        """The body for ``leg`` under the current strategy; None if the leg cannot serve it."""
        body = self.adapter.upstream_body(self._body, leg.model)
        self.accumulator.origin = leg.upstream.kind
        body = self.background.request(leg, self.adapter, body)
        ask: Ask | None = Ask(body)
        if self._strategy is not None:
            mode = self._upstreams.continuation_of(leg)
            need = Need(self.adapter, body, mode, self.accumulator, self.route, self._budget_left())
            ask = self._strategy.ask(need)
        if ask is None:
            return None
        self._seam, self._prefilled = ask.seam, ask.prefill
        body = self._upstreams.upstream_body(leg, ask.body)  # as its provider takes it
        # A copy the size of the JSON: orjson's own buffer is 4 KB at least and is never
        # shrunk, and this one is kept (by the upstream request) as long as the run.
        return bytes(memoryview(orjson.dumps(body)))

    def background_response(self) -> str | None:
        """The first leg's upstream response, while it is a background one that can be
        read again: what a checkpoint keeps for a takeover (``restore``)."""
        position = self.splicer.resumable()
        return None if position is None or self.splicer.leg else position.response

    def _budget_left(self) -> int | None:
        """Output tokens the client's request still allows (None: it set no limit)."""
        budget = self.adapter.budget(self._body)
        return None if budget is None else budget - self.accumulator.output_spent()

    def idle_timeout(self, leg: ResolvedLeg) -> float:
        """The longest silence a leg's stream may keep before it counts as stalled, while
        its model may be thinking silently: doubled for a reasoning request, until the
        answer itself (text, tool arguments) flows, then the route's idle (``_relay``)."""
        idle = leg.timeouts.idle  # the route's, where it sets one; else the upstream's
        return 2 * idle if is_reasoning_request(self._body, leg.model) else idle

    async def open(self) -> None:
        """Open an attempt, retrying and falling back until a leg answers with headers.

        Raises the last attempt's error once every leg's budget is spent: an
        ``UpstreamHTTPError`` (passed through unchanged before the client stream
        started) or a ``GatewayError``.
        """
        try:
            await self._open()
        except BaseException as exc:
            if self._strategy is None:  # no stream started: the run ends here
                cancelled = isinstance(exc, asyncio.CancelledError)
                self.end_trace(error_type(exc), "cancelled" if cancelled else "failed")
            raise

    async def _open(self) -> None:
        attempts, trace = self.attempts, self.trace
        while True:
            leg = attempts.leg
            if not attempts.allowed():
                attempts.next_leg(UpstreamFailure(f"Upstream {leg.upstream.name!r} is skipped."))
                continue
            if self._continuing:  # an ``auto`` leg learns once what its server takes
                await self._upstreams.learn_continuation(leg, self._client_authorization)
            body = self.request_body(leg)
            if body is None:
                attempts.next_leg(
                    UpstreamFailure(f"Upstream {leg.upstream.name!r} cannot continue an answer.")
                )
                continue
            loop = asyncio.get_running_loop()
            self._first_event_deadline = loop.time() + leg.timeouts.first_byte
            headers = None if trace is None else self._trace_attempt(trace, leg)
            try:
                self._response = await self._upstreams.open_stream(
                    leg,
                    body,
                    self._client_authorization,
                    self.idle_timeout(leg),
                    self._path,
                    headers,
                )
            except UpstreamHTTPError as exc:
                if trace is not None:
                    trace.attempt_failed(attempt_result(exc), exc.status_code, str(exc))
                if self.background.refused(leg, exc):  # it names background: that first
                    attempts.count("background_refused")  # the same leg again, in the foreground
                    continue
                if self._refused_prefill(leg, exc):
                    # Not the leg's failure: the same leg again at once, in prompt mode.
                    attempts.count("prefill_refused")
                    continue
                await attempts.failed_open(exc, first=self._strategy is None)
            except UpstreamFailure as exc:
                if trace is not None:
                    trace.attempt_failed(attempt_result(exc), None, exc.message)
                await attempts.failed_open(exc, first=self._strategy is None)
            else:
                attempts.count("ok")
                if trace is not None:
                    trace.attempt_answered(self._response.status_code)
                self._request_bytes = len(body)
                return

    def _refused_prefill(self, leg: ResolvedLeg, exc: UpstreamHTTPError) -> bool:
        """A continuation ending with an assistant message was refused (400/422): the
        model takes no prefill (Claude 4.6+, some OpenAI-compatible servers). Remembered
        for the upstream and model, so later runs go straight to prompt mode."""
        if not self._continuing:
            return False
        # What was sent, not the leg's mode: a request with thinking on, or a prefix of
        # whitespace only, went in prompt mode whatever the mode says.
        mode = self._upstreams.continuation_of(leg)
        if exc.status_code not in (400, 422) or not self._prefilled:
            return False
        if is_context_length_error(exc.content) or b"beta" in exc.content.lower():
            return False  # too long, or a beta the leg's cloud refuses: not the prefill
        self._upstreams.refuses_prefill(leg)
        self._metrics.prefill_refusals.labels(leg.upstream.name, mode).inc()
        logger.info(
            "continuation refused prefill; continuing in prompt mode",
            extra={"run_id": self.id, "upstream": leg.upstream.name, "mode": mode},
        )
        return True

    async def aclose(self) -> None:
        if self._response is not None:
            response, self._response = self._response, None
            rest, self._after_done = self._after_done, None
            try:
                if rest is not None and not whole(response):
                    await _drain(rest)
            finally:
                # Even when cancelled (a run stopped mid-drain): Http1Transport closes a
                # response without suspending, so the connection is never leaked.
                await response.aclose()

    # -- the client stream ----------------------------------------------------------

    async def relay(self, emit: Emit, resume: Cause | None = None) -> None:
        """Relay the client's SSE body into ``emit``: spliced events, then the successful
        end or an error event.

        ``resume``: the run was restored from a checkpoint (``restore``) and starts
        with a recovery, as if its stream had broken for that cause.
        """
        metrics, route = self._metrics, self.route.name
        metrics.active_streams.inc()
        failure = None if resume is None else self._interrupted(resume)
        error = None
        try:
            await self._run(emit, failure)
        except GatewayError as exc:
            self.outcome, error = "failed", error_type(exc)
            await _emitted(emit, self.splicer.fail(exc))
        except asyncio.CancelledError:
            self.outcome = self.outcome or "detached"
            await self.background.abandon(self.leg, self.splicer)
            raise
        except Exception:
            self.outcome, error = "failed", "internal_error"
            logger.exception("run failed", extra={"run_id": self.id})
            failed = GatewayError("The gateway failed while relaying the answer.")
            await _emitted(emit, self.splicer.fail(failed))
        finally:
            metrics.active_streams.dec()
            metrics.stream_duration.labels(route).observe(time.perf_counter() - self._started)
            self._count_tokens()
            self.end_trace(error)
            await self.aclose()

    async def collect(self) -> dict[str, Any]:
        """Run to the end for a non-streaming client; return the assembled answer."""
        error = None
        try:
            await self._run(_discard)
        except asyncio.CancelledError:
            # Its client left (api/chat.py): the upstream response is closed below.
            self.outcome = self.outcome or "cancelled"
            await self.background.abandon(self.leg, self.splicer)
            raise
        except BaseException as exc:
            self.outcome, error = self.outcome or "failed", error_type(exc)
            raise
        finally:
            self._count_tokens()
            self.end_trace(error)
            await self.aclose()
        return self.adapter.assemble(self.accumulator)

    async def _run(self, emit: Emit, failure: StreamInterrupted | None = None) -> None:
        """Relay legs until the answer is complete; start by recovering from ``failure``."""
        self._awaiting_content = not self.accumulator.text_chars
        catch_up, taken_over = None, failure
        if failure is not None and self._restored_background is not None:
            catch_up = await self._take_over_upstream(failure, emit)
            if catch_up is not None:
                emit, failure = catch_up, None
        while True:
            if failure is None:
                try:
                    await self._relay(emit)
                    self.attempts.stream_ended(healthy=True)
                    self._trace_leg_ended()
                    self._count_recoveries("recovered")
                    await _emitted(emit, self.splicer.close())
                    self.outcome = "done"
                    return
                except StreamInterrupted as interrupted:
                    if not interrupted.fatal:  # a fatal error is a refusal, not ill health
                        self.attempts.stream_ended(healthy=False)
                    if self.trace is not None:
                        chars = self.accumulator.text_chars
                        self.trace.interrupted(interrupted.cause.value, interrupted.message, chars)
                    failure = interrupted
                    await self.aclose()
            if catch_up is not None and not catch_up.caught_up:
                # Read again, it broke off (or differed) before it had rendered all the
                # client has: the client's view from its log, and the usual plans.
                assert taken_over is not None
                self.accumulator = catch_up.restored.accumulator
                self.splicer = catch_up.restored.splicer
                emit, failure = catch_up.restored.emit, taken_over
                self.background.cancel_later(self.leg, catch_up.restored.response)
                catch_up = None
            self.last_cause = failure.cause
            position = self.background.where(self.splicer, failure.cause, fatal=failure.fatal)
            if position is not None and await self._read_again(failure, position):
                failure = None  # the same leg, read on from where it broke
                continue
            self.background.leave(self.leg, self.splicer, failure.cause)
            if not (self.splicer.finished and self.splicer.leg in self.accumulator.usage_by_leg):
                # Broke before it reported its usage: estimated (a break after the answer's
                # end and its usage, before the body's, costs nothing more).
                self.accumulator.measure(self.splicer.leg).broke = True
            if self.on_interrupted is not None:
                self.on_interrupted()
            self.splicer.end_leg()
            self._trace_leg_ended()
            if self.splicer.finished:  # broke after the answer was complete
                self._count_recoveries("recovered")
                await _emitted(emit, self.splicer.close())
                self.outcome = "done"
                return
            plan = plan_recovery(
                self.splicer.snapshot(),
                budget_left=self._budget_left(),
                structured=self.adapter.structured(self._body),
                diverged=failure.cause is Cause.DIVERGED,
            )
            strategy = strategy_for(plan)
            end = strategy.end(self.splicer, fatal=failure.fatal)
            if end is not None:
                self._log_recovery(failure.cause, plan)
                self._plans.append(plan)
                self.recoveries += 1
                self._count_recoveries("recovered")
                await _emitted(emit, end)
                await _emitted(emit, self.splicer.close())
                self.outcome = "done"
                return
            if failure.fatal:
                self._count_recoveries("failed")
                raise self._final(failure) from None
            self._strategy = strategy
            self._plans.append(plan)
            self.recoveries += 1
            try:
                await self.attempts.after_interruption(failure, failure.cause)
                self._log_recovery(failure.cause, plan)
                await self.open()
            except (GatewayError, UpstreamHTTPError) as exc:
                self._count_recoveries("failed")
                raise self._final(failure, exc) from None
            self.splicer.begin_leg(plan, self._seam)
            failure = None

    async def _read_again(self, failure: StreamInterrupted, position: Position) -> bool:
        """Read the open leg's background response again after ``position`` (``Reattach``;
        -1: from its first event); whether it answered. No backoff: the generation did not
        fail, its connection did."""
        plan = plan_recovery(self.splicer.snapshot(), resumable=True)
        if self.on_interrupted is not None:
            self.on_interrupted()
        self._log_recovery(failure.cause, plan)
        leg, trace = self.leg, self.trace
        previous, self._strategy = self._strategy, strategy_for(plan)
        headers = None if trace is None else self._trace_attempt(trace, leg)
        try:
            self._response = await self._upstreams.reattach(
                leg, position, self._client_authorization, self.idle_timeout(leg), headers
            )
        except (UpstreamHTTPError, UpstreamFailure) as exc:
            self._strategy = previous
            status = exc.status_code if isinstance(exc, UpstreamHTTPError) else None
            if trace is not None:
                trace.attempt_failed(attempt_result(exc), status, str(exc))
            self._metrics.recoveries.labels(plan.value, "failed").inc()
            logger.info(
                "reattach failed; the usual plans follow",
                extra={"run_id": self.id, "upstream": leg.upstream.name, "status": status},
            )
            self.background.ended(position, status)
            return False
        if trace is not None:
            trace.attempt_answered(self._response.status_code)
        loop = asyncio.get_running_loop()
        self._first_event_deadline = loop.time() + leg.timeouts.first_byte
        self._plans.append(plan)
        self.recoveries += 1
        return True

    async def _take_over_upstream(self, failure: StreamInterrupted, emit: Emit) -> CatchUp | None:
        """A takeover of a run whose first leg is a background response: read it again
        from its first event into a new splicer, with ``CatchUp`` as the emit that checks
        what the client has and sends only the rest (gateway/runs/catchup.py); None if
        the upstream cannot (then the usual takeover plans)."""
        response, self._restored_background = self._restored_background, None
        events, self._restored_events = self._restored_events, []
        if response is None or failure.cause not in REATTACHABLE:
            return None
        if not await self._read_again(failure, Position(response, -1)):
            return None
        restored = Restored(self.accumulator, self.splicer, emit, response)
        self.accumulator = self.adapter.new_accumulator()
        self.splicer = self.adapter.splicer(self.accumulator, self._body)
        return CatchUp(events, restored)

    def _final(self, failure: StreamInterrupted, later: Exception | None = None) -> GatewayError:
        """The error that ends the client stream: the original failure, naming dropped tools."""
        message = failure.message
        if later is not None and later is not failure:
            message += " Recovery failed too."
        dropped = self.splicer.in_flight()
        if dropped:
            message += f" The incomplete tool call {', '.join(map(repr, dropped))} was dropped."
        return StreamInterrupted(message, failure.cause, fatal=failure.fatal)

    async def _relay(self, emit: Emit) -> None:
        """Relay the open attempt into ``emit``; ``StreamInterrupted`` if it breaks.

        One loop from the upstream's bytes to the client's: read, decode the SSE,
        parse, splice, emit. Nothing here yields per event.
        """
        assert self._response is not None, "open() first"
        splicer, adapter, accumulator = self.splicer, self.adapter, self.accumulator
        parse, delta_chars = adapter.parse_event, adapter.delta_chars
        measure = accumulator.measure(splicer.leg)
        measure.request_bytes = self._request_bytes
        # A reasoning request's doubled idle while its model may think silently: until
        # the answer flows, and again from a new reasoning item or thinking block.
        idle, thinking_idle = self.leg.timeouts.idle, self.idle_timeout(self.leg)
        reasoning = thinking = thinking_idle > idle
        received = False
        clock = asyncio.get_running_loop().time
        guard: ThroughputGuard | None = None
        decoder = self._upstreams.decoder(self.leg)
        # One iterator: its rest is drained later.
        body = aiter(event_stream(self._response, self._upstreams.media_type(self.leg)))
        try:
            async with asyncio.timeout_at(self._first_event_deadline) as first_event:
                async for raw in body:
                    for data in decoder.feed(raw):
                        event = parse(data)
                        if type(event) is Chunk:
                            if not received:
                                received = True
                                first_event.reschedule(None)
                                guard = self._throughput_guard(clock())
                            # What the leg's usage is estimated from, should it break.
                            added = delta_chars(event)
                            if added:
                                measure.output_chars += added
                                measure.output_deltas += 1
                            slow = guard is not None and guard.add(added, clock())
                            if reasoning:
                                if thinking and adapter.answers(event):
                                    thinking = False
                                    set_read_timeout(self._response, idle)
                                elif not thinking and adapter.thinks(event):
                                    thinking = True
                                    set_read_timeout(self._response, thinking_idle)
                            out = splicer.feed(event)
                            if out is not None:
                                if self._awaiting_content and accumulator.text_chars:
                                    self._first_token()
                                wait = emit(out)
                                if wait is not None:
                                    await wait
                            if slow and not splicer.finished:
                                raise self._interrupted(Cause.SLOW)
                        elif type(event) is Malformed:
                            self._metrics.malformed_events.labels(self.leg.upstream.name).inc()
                        elif type(event) is InBandError:
                            fatal = not is_transient_error(event.error)
                            raise self._interrupted(Cause.IN_BAND_ERROR, event.message, fatal=fatal)
                        elif type(event) is Done:
                            self._after_done = body  # read to its end before closing
                            break
                    if self._after_done is not None:
                        break
        except TimeoutError:
            raise self._interrupted(Cause.FIRST_BYTE_TIMEOUT) from None
        except SeamDiverged:
            # Not shown: a verified replay comes next, unless this was one already.
            fatal = self._seam is REPLAY
            raise self._interrupted(Cause.DIVERGED, fatal=fatal) from None
        except httpx2.TransportError as exc:
            raise self._interrupted(classify_transport_error(exc)) from None
        if not splicer.finished:
            raise self._interrupted(Cause.TRUNCATED)

    def _throughput_guard(self, start: float) -> ThroughputGuard | None:
        """The slow-stream check of a leg whose first event came at ``start``: the route's
        ``min_throughput``, on every leg but the last, where a slow answer beats none."""
        minimum = self.route.min_throughput
        if minimum is None or self.attempts.on_last_leg:
            return None
        return ThroughputGuard(minimum, start)

    def _interrupted(
        self, cause: Cause, detail: str | None = None, *, fatal: bool = False
    ) -> StreamInterrupted:
        upstream = self.leg.upstream.name
        self._metrics.interruptions.labels(upstream, cause.value).inc()
        message = f"Upstream {upstream!r} {DESCRIPTIONS[cause]}"
        if detail:  # the upstream's own words, which may echo its key
            message += f": {self._upstreams.scrub(detail.encode()).decode()}"
        chars = self.accumulator.text_chars
        if chars:
            message += f" (after {chars} characters of the answer)"
        return StreamInterrupted(message + "; the answer is incomplete.", cause, fatal=fatal)


async def _emitted(emit: Emit, data: bytes) -> None:
    wait = emit(data)
    if wait is not None:
        await wait
