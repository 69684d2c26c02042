"""One chat-completion run: open an upstream leg, relay its events, end the client stream right.

The run is the unit the recovery engine works on: it owns the accumulator (what
the client has), the open upstream response and the decision of how the client
stream ends. Today a run has one leg and one attempt; an interruption ends the
client stream with an in-band error event, never with a clean end that looks
like success (ARCHITECTURE.md section 2, item 6).

Hot path (per chunk): parse the payload once (orjson), feed the accumulator,
forward the payload bytes as received. No logging, no re-encoding.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import orjson

from gateway.errors import GatewayError, UpstreamFailure, sse_error_event
from gateway.metrics import Metrics
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.classify import DESCRIPTIONS, Cause, classify_transport_error
from gateway.recovery.events import Chunk, Done, InBandError, Malformed, parse_event
from gateway.upstream.client import UpstreamClient
from gateway.upstream.routes import ResolvedLeg, ResolvedRoute
from gateway.upstream.sse import aiter_data

logger = logging.getLogger("gateway.run")

DONE_EVENT = b"data: [DONE]\n\n"
_REASONING_MODEL = re.compile(r"(?:^|[^a-z0-9])o[134](?:$|[^0-9])|thinking|reasoning")


def is_reasoning_request(body: dict[str, Any], model: str) -> bool:
    """Reasoning models think silently for long stretches: their idle timeout doubles."""
    return body.get("reasoning_effort") is not None or bool(_REASONING_MODEL.search(model.lower()))


class StreamInterrupted(UpstreamFailure):
    code = "upstream_interrupted"

    def __init__(self, message: str, cause: Cause) -> None:
        super().__init__(message)
        self.cause = cause


class ChatRun:
    def __init__(
        self,
        *,
        route: ResolvedRoute,
        body: dict[str, Any],
        client_authorization: str | None,
        upstreams: UpstreamClient,
        metrics: Metrics,
        started: float | None = None,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.route = route
        self.stream = bool(body.get("stream"))
        self.accumulator = RunAccumulator()
        self._body = body
        self._client_authorization = client_authorization
        self._upstreams = upstreams
        self._metrics = metrics
        self._started = time.perf_counter() if started is None else started
        self._leg: ResolvedLeg = route.legs[0]
        self._response: httpx.Response | None = None
        self._first_event_deadline = 0.0

    def upstream_body(self, leg: ResolvedLeg) -> bytes:
        body = dict(self._body)
        body["model"] = leg.model
        if not self.stream:
            # Non-streaming clients get the same protection: the gateway streams
            # from the upstream and assembles the completion itself.
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return orjson.dumps(body)

    def idle_timeout(self, leg: ResolvedLeg) -> float:
        idle = leg.upstream.timeouts.idle
        return 2 * idle if is_reasoning_request(self._body, leg.model) else idle

    async def open(self) -> None:
        """Open the first leg and wait for its headers (errors here are HTTP errors)."""
        leg = self._leg
        loop = asyncio.get_running_loop()
        self._first_event_deadline = loop.time() + leg.upstream.timeouts.first_byte
        self._response = await self._upstreams.open_stream(
            leg, self.upstream_body(leg), self._client_authorization, self.idle_timeout(leg)
        )

    async def aclose(self) -> None:
        if self._response is not None:
            # Shielded: on client disconnect the surrounding scope is already cancelled,
            # and the upstream connection must still be closed, not leaked.
            with anyio.CancelScope(shield=True):
                await self._response.aclose()

    async def aiter_sse(self) -> AsyncIterator[bytes]:
        """The client's SSE body: upstream chunks as received, then ``[DONE]`` or an error."""
        metrics, route = self._metrics, self.route.name
        metrics.active_streams.inc()
        awaiting_content = True
        try:
            async for data in self._relay():
                if awaiting_content and self.accumulator.content_deltas:
                    awaiting_content = False
                    metrics.ttft.labels(route).observe(time.perf_counter() - self._started)
                yield b"data: " + data.encode() + b"\n\n"
            yield DONE_EVENT
        except GatewayError as exc:
            yield sse_error_event(exc)
        except Exception:
            logger.exception("run %s failed", self.id)
            yield sse_error_event(GatewayError("The gateway failed while relaying the answer."))
        finally:
            metrics.active_streams.dec()
            metrics.stream_duration.labels(route).observe(time.perf_counter() - self._started)
            metrics.requests.labels(route, "POST", "200").inc()
            await self.aclose()

    async def collect(self) -> dict[str, Any]:
        """Relay to nobody and return the assembled ``chat.completion``."""
        try:
            async for _ in self._relay():
                pass
        finally:
            await self.aclose()
        return self.accumulator.to_completion()

    async def _relay(self) -> AsyncIterator[str]:
        """Yield each chunk payload to forward; raise ``StreamInterrupted`` if the stream breaks."""
        assert self._response is not None, "open() first"
        accumulator = self.accumulator
        upstream = self._leg.upstream.name
        try:
            async with asyncio.timeout(self._first_event_deadline) as first_event:
                async for data in aiter_data(self._response):
                    event = parse_event(data)
                    if type(event) is Chunk:
                        if not accumulator.chunks:
                            first_event.reschedule(None)
                        accumulator.feed(event.obj)
                        yield event.data
                    elif type(event) is Malformed:
                        self._metrics.malformed_events.labels(upstream).inc()
                    elif type(event) is InBandError:
                        raise self._interrupted(Cause.IN_BAND_ERROR, event.message)
                    elif type(event) is Done:
                        break
        except TimeoutError:
            raise self._interrupted(Cause.FIRST_BYTE_TIMEOUT) from None
        except httpx.TransportError as exc:
            raise self._interrupted(classify_transport_error(exc)) from None
        if accumulator.finish_reason is None:
            raise self._interrupted(Cause.TRUNCATED)

    def _interrupted(self, cause: Cause, detail: str | None = None) -> StreamInterrupted:
        upstream = self._leg.upstream.name
        self._metrics.interruptions.labels(upstream, cause.value).inc()
        message = f"Upstream {upstream!r} {DESCRIPTIONS[cause]}"
        if detail:
            message += f": {detail}"
        chars = self.accumulator.text_chars
        if chars:
            message += f" (after {chars} characters of the answer)"
        return StreamInterrupted(message + "; the answer is incomplete.", cause)
