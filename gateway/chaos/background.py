"""OpenAI's background mode in the Responses dialect: a generation that outlives its connection.

``POST /v1/responses`` with ``"background": true`` (and ``store`` not false: else a 400,
as OpenAI answers) stores a *generation*: its events, from ``response.created`` (status
``queued``), ``response.queued`` and ``response.in_progress`` (status ``in_progress``)
on to exactly the events the same request's ordinary answer has after its own
``response.in_progress``, numbered 0, 1, 2, … The Response objects say ``"background":
true, "store": true``; the usage is the ordinary answer's.

The generation runs on a timeline of its own, not on a connection: event ``i`` exists
from ``t0 + i * pace`` (``pace_ms``), whether anybody reads it or not. So nothing here
runs a task: a reader (the creating request or a retrieve) writes what exists, then
sleeps until the next event is due or the response is cancelled, and a status is read
off the clock.

The doors (``ChaosUpstream`` dispatches here):

- ``POST /v1/responses`` with ``background: true``: streamed, the events as they are
  generated; not streamed, the Response object at once, status ``queued``.
- ``GET /v1/responses/{id}?stream=true&starting_after=N``: the events numbered after
  ``N`` (from the first without it): those generated at once, the rest as they are
  generated; then the body ends. Only a response created with ``stream: true`` can be
  streamed again (OpenAI's limit): else a 400. Without ``stream=true``: the Response
  object as it stands (status, output so far, usage once completed).
- ``POST /v1/responses/{id}/cancel``: a queued or in-progress response stops where it
  is (no event after it is generated) and is ``cancelled``, its Response returned;
  cancelling it again returns the same (idempotent, as OpenAI documents); a completed or
  failed one is a 400.
- The same under Azure's ``/openai/v1/responses/…`` and ``/openai/responses/…`` (its
  ``api-key`` checked).
- An unknown id, or one forgotten ``ttl`` seconds after its generation ended (OpenAI
  keeps background responses about ten minutes; ``ChaosUpstream(background_ttl=…)``):
  a 404. A response created without ``background`` is not kept: a 404 here too.

Faults (the spec's, on the creating request; ``times=`` counts as ever):

- a connection fault, ``reset``, ``close``, ``stall`` or ``no_finish`` (a body that
  ends cleanly too early), cuts the creating request's connection after ``at`` deltas;
  the generation goes on. ``malformed`` garbles that connection's stream alone.
- an in-band error (``error``, ``error_fatal``, ``error_done``, ``finish_error``) is a
  generation that fails: after ``at`` deltas it ends with an ``error`` event and
  ``response.failed`` (code and message as ``responses.IN_BAND_ERRORS`` says), for
  every reader.
- ``retrieve_faults=K``: the first K streamed retrieves of each response are cut as
  well, ``at`` deltas after where they start (half-way through what is left, without
  ``at``), by the spec's connection fault (a ``reset`` for any other fault).

A cancelled response's streams end cleanly after its last generated event, without a
terminal event: OpenAI documents none for a cancel (there is no
``response.cancelled``), and ``response.failed`` or ``response.incomplete`` would say
something a cancel is not. A reader learns why by retrieving the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs

import orjson

from gateway.chaos import clouds, responses
from gateway.chaos.faults import fault_cut, reset, stall
from gateway.chaos.http11 import LAST_CHUNK, SSE_HEAD, Request, chunk
from gateway.chaos.render import EventFormat
from gateway.chaos.responses import Event, ResponsesPlan
from gateway.chaos.spec import HTTP2_FAULTS, ChaosSpec
from gateway.chaos.wire import drain, send_json, send_json_cut

TTL = 600.0  # seconds a background response is kept after it ended, as OpenAI keeps them
MAX_KEPT = 10_000  # past this many, the oldest is forgotten first
OPENING = 3  # response.created, response.queued, response.in_progress

Ending = Literal["end", "reset", "close", "stall"]
# The faults that cut one connection and leave the generation alone, and how they end it.
CONNECTION_FAULTS: dict[str, Ending] = {
    "reset": "reset",
    "close": "close",
    "stall": "stall",
    "no_finish": "end",
}

_KEPT = {"background": True, "store": True}
_PATH = re.compile(r"^(/v1|/openai/v1|/openai)/responses/([^/]+)(/cancel)?$")
_AZURE = clouds.Door("azure", "/v1/responses", None, None)
_BATCH = 256  # events per write at most: drain() between batches holds a huge answer
_EPSILON = 1e-9  # an event due at t is generated at t, whatever the float rounding


def is_background_path(path: str) -> bool:
    """Whether ``path`` names one response (a retrieve) or its cancel."""
    return _PATH.match(path) is not None


def refusal(payload: dict[str, Any]) -> bytes | None:
    """OpenAI's 400 for a background request that says ``store: false``, or None."""
    if payload.get("background") is not True or payload.get("store") is not False:
        return None
    message = "Background mode requires store=true; this request sets store=false."
    return _error_body(message, "background")


def _error_body(message: str, param: str | None = None, code: str | None = None) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return orjson.dumps({"error": error})


def _rest(fields: dict[str, Any]) -> bytes:
    return b"," + orjson.dumps(fields)[1:]


def output_of(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The output items of a Response whose events so far are ``events``: done items
    whole, an item still being generated with what its deltas said."""
    output: list[dict[str, Any]] = []
    for kind, rest in events:
        if rest is None or kind in (responses.CREATED, responses.QUEUED, responses.IN_PROGRESS):
            continue
        fields = orjson.loads(b'{"_":0' + rest)
        if kind == responses.ITEM_ADDED:
            output.append(fields["item"])
        elif kind == responses.ITEM_DONE:
            output[fields["output_index"]] = fields["item"]
        elif kind == responses.CONTENT_PART_ADDED:
            output[fields["output_index"]]["content"].append(fields["part"])
        elif kind == responses.SUMMARY_PART_ADDED:
            output[fields["output_index"]]["summary"].append(fields["part"])
        elif kind == responses.TEXT_DELTA:
            output[fields["output_index"]]["content"][-1]["text"] += fields["delta"]
        elif kind == responses.SUMMARY_DELTA:
            output[fields["output_index"]]["summary"][-1]["text"] += fields["delta"]
        elif kind == responses.ARGUMENTS_DELTA:
            output[fields["output_index"]]["arguments"] += fields["delta"]
    return output


@dataclass(eq=False)
class Generation:
    """One background response: its events (the terminal one included), which of them
    carry content, their SSE bytes, and its timeline."""

    spec: ChaosSpec
    streamed: bool  # created with stream: true, so it can be streamed again
    events: list[Event]
    counts: list[bool]
    encoded: list[bytes]
    opened: dict[str, Any]  # the Response as created (status queued)
    final: dict[str, Any]  # the Response its terminal event carries
    t0: float  # time.monotonic() when event 0 was generated
    pace: float
    retrieve_faults: int  # streamed retrieves still to cut
    cancelled_at: float | None = None
    _kept: int | None = None  # events generated before the cancel
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def response_id(self) -> str:
        return str(self.opened["id"])

    def generated(self, now: float) -> int:
        """How many events exist at ``now``."""
        if self._kept is not None:
            return self._kept
        if not self.pace:
            return len(self.events)
        if now < self.t0:
            return 0
        return min(len(self.events), int((now - self.t0) / self.pace + _EPSILON) + 1)

    def due(self, index: int) -> float:
        return self.t0 + index * self.pace

    def ended(self, now: float) -> bool:
        return self.cancelled_at is not None or self.generated(now) == len(self.events)

    def ended_at(self) -> float:
        """When the generation ended (or will): its cancel, or its last event."""
        if self.cancelled_at is not None:
            return self.cancelled_at
        return self.due(len(self.events) - 1)

    def status(self, now: float) -> str:
        if self.cancelled_at is not None:
            return "cancelled"
        generated = self.generated(now)
        if generated == len(self.events):
            return str(self.final["status"])
        return "in_progress" if generated >= OPENING else "queued"

    def snapshot(self, now: float) -> dict[str, Any]:
        """The Response as a retrieve sees it at ``now``."""
        status = self.status(now)
        if status in ("completed", "failed"):
            return self.final
        output = output_of(self.events[: self.generated(now)])
        return self.opened | {"status": status, "output": output}

    def cancel(self, now: float) -> None:
        self._kept = self.generated(now)
        self.cancelled_at = now
        self._stopped.set()

    async def wait(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or less if the response is cancelled meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(delay, 0.0)):
                await self._stopped.wait()


def generation(
    plan: ResponsesPlan, spec: ChaosSpec, fault: str | None, streamed: bool, now: float
) -> Generation:
    """The background generation of ``plan`` (an ordinary answer's events): its opening
    in background mode, and, under an in-band fault, its failure after ``at`` deltas."""
    opened = plan.response | {"status": "queued", "output": [], "usage": None} | _KEPT
    progressing = opened | {"status": "in_progress"}
    events: list[Event] = [
        (responses.CREATED, _rest({"response": opened})),
        (responses.QUEUED, _rest({"response": opened})),
        (responses.IN_PROGRESS, _rest({"response": progressing})),
        *plan.events[2:-1],  # between the ordinary answer's in_progress and completed
    ]
    counts = [False] * OPENING + plan.counts[2:-1]
    if fault in responses.IN_BAND_ERRORS:
        cut = fault_cut(counts, spec.at, opening=OPENING)
        events, counts = events[:cut], counts[:cut]
        _, code, message = responses.IN_BAND_ERRORS[fault]
        error = {"code": code, "message": message}
        final = opened | {"status": "failed", "error": error, "output": output_of(events)}
        events.append((responses.ERROR, _rest(error | {"param": None})))
        events.append((responses.FAILED, _rest({"response": final})))
        counts += [False, False]
    else:
        final = plan.response | _KEPT
        events.append((responses.COMPLETED, _rest({"response": final})))
        counts.append(False)
    encoded = responses.encode_events(events, EventFormat(spec.line_ending, spec.comments))
    return Generation(
        spec,
        streamed,
        events,
        counts,
        encoded,
        opened,
        final,
        t0=now,
        pace=spec.pace_ms / 1000,
        retrieve_faults=spec.retrieve_faults,
    )


class BackgroundResponses:
    """The background responses of one server, by id.

    Touched from the server's event loop only, but for ``status``, which a test's thread
    may call: it reads and never removes.
    """

    def __init__(self, ttl: float = TTL) -> None:
        self.ttl = ttl
        self.started = 0  # generations started: background creates answered
        self._kept: dict[str, Generation] = {}

    def status(self, response_id: str) -> str | None:
        """A kept response's status now (queued, in_progress, completed, failed,
        cancelled), or None: unknown or forgotten."""
        now = time.monotonic()
        kept = self._find(response_id, now)
        return None if kept is None else kept.status(now)

    def _find(self, response_id: str, now: float) -> Generation | None:
        kept = self._kept.get(response_id)
        if kept is None or self._expired(kept, now):
            return None
        return kept

    def _expired(self, kept: Generation, now: float) -> bool:
        return kept.ended(now) and now > kept.ended_at() + self.ttl

    def _forget_expired(self, now: float) -> None:
        for response_id in [key for key, kept in self._kept.items() if self._expired(kept, now)]:
            del self._kept[response_id]
        while len(self._kept) >= MAX_KEPT:
            del self._kept[next(iter(self._kept))]

    async def create(
        self,
        request: Request,
        payload: dict[str, Any],
        spec: ChaosSpec,
        plan: ResponsesPlan,
        fault: str | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """A background ``POST /v1/responses``: keep its generation, then answer the
        request; return whether the connection can serve another."""
        now = time.monotonic()
        self._forget_expired(now)
        streamed = payload.get("stream") is True
        kept = generation(plan, spec, fault, streamed, now)
        self._kept[kept.response_id] = kept
        self.started += 1
        if not streamed:  # at once, as OpenAI answers: before any of it is generated
            body = orjson.dumps(kept.opened)
            if fault in ("reset", "close"):
                await send_json_cut(writer, body, fault)
                return False
            return await _reply(writer, request, 200, body)
        ending = CONNECTION_FAULTS.get(fault or "", "end")
        cut = len(kept.events)
        if fault in CONNECTION_FAULTS:
            cut = fault_cut(kept.counts, spec.at, opening=OPENING)
        garbled = None
        if fault == "malformed":
            at = fault_cut(kept.counts, spec.at, opening=OPENING)
            events_format = EventFormat(spec.line_ending, spec.comments)
            garbled = (at, events_format.named(responses.TEXT_DELTA, responses.MALFORMED, at))
        await _relay(writer, kept, 0, cut, garbled)
        return await _end(request, reader, writer, spec, ending)

    async def serve(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """A retrieve or a cancel (``is_background_path``); return whether the connection
        can serve another request."""
        found = _PATH.match(request.path)
        assert found is not None
        door, response_id, cancel = found.groups()
        if door != "/v1":
            try:
                clouds.check_azure(request, _AZURE)
            except clouds.Refused as refused:
                return await _reply(writer, request, refused.status, refused.body)
        if request.method != ("POST" if cancel else "GET"):
            message = f"Unknown request URL: {request.method} {request.path}."
            return await _reply(writer, request, 404, _error_body(message, code="unknown_url"))
        now = time.monotonic()
        kept = self._find(response_id, now)
        if kept is None:
            message = f"No response found with id '{response_id}'."
            return await _reply(writer, request, 404, _error_body(message))
        if cancel:
            return await _cancel(request, writer, kept, now)
        query = parse_qs(request.query)
        if query.get("stream", [""])[-1] != "true":
            return await _reply(writer, request, 200, orjson.dumps(kept.snapshot(now)))
        if not kept.streamed:
            message = "This response was not created with stream=true and cannot be streamed."
            return await _reply(writer, request, 400, _error_body(message, "stream"))
        try:
            start = int(query.get("starting_after", ["-1"])[-1]) + 1
        except ValueError:
            message = "Invalid 'starting_after': expected an integer."
            return await _reply(writer, request, 400, _error_body(message, "starting_after"))
        start = max(start, 0)
        if kept.retrieve_faults:
            kept.retrieve_faults -= 1
            return await self._cut_retrieve(request, reader, writer, kept, start)
        await _relay(writer, kept, start, len(kept.events))
        return await _end(request, reader, writer, kept.spec, "end")

    @staticmethod
    async def _cut_retrieve(
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        kept: Generation,
        start: int,
    ) -> bool:
        """A streamed retrieve ``retrieve_faults`` cuts: ``at`` deltas after ``start``."""
        spec = kept.spec
        cut = start + fault_cut(kept.counts[start:], spec.at, opening=0)
        fault = HTTP2_FAULTS.get(spec.fault or "", spec.fault or "")
        await _relay(writer, kept, start, cut)
        return await _end(request, reader, writer, spec, CONNECTION_FAULTS.get(fault, "reset"))


async def _cancel(
    request: Request, writer: asyncio.StreamWriter, kept: Generation, now: float
) -> bool:
    status = kept.status(now)
    if status in ("completed", "failed"):
        message = f"Cannot cancel a {status} response."
        return await _reply(writer, request, 400, _error_body(message))
    if status != "cancelled":
        kept.cancel(now)
    return await _reply(writer, request, 200, orjson.dumps(kept.snapshot(now)))


async def _relay(
    writer: asyncio.StreamWriter,
    kept: Generation,
    start: int,
    cut: int,
    garbled: tuple[int, bytes] | None = None,
) -> None:
    """Write the stream's head, then the events from ``start`` as they are generated, up
    to ``cut`` or the generation's end; ``garbled``: a malformed event to write before
    the event it numbers."""
    writer.write(SSE_HEAD)
    index = start
    while index < cut:
        now = time.monotonic()
        ready = min(kept.generated(now), cut, index + _BATCH)
        if index < ready:
            pieces = kept.encoded[index:ready]
            if garbled is not None and index <= garbled[0] < ready:
                pieces.insert(garbled[0] - index, garbled[1])
            writer.write(b"".join([chunk(piece) for piece in pieces]))
            await drain(writer)
            index = ready
        elif kept.ended(now):
            return  # cancelled: nothing more will be generated
        else:
            await kept.wait(kept.due(index) - now)
    await drain(writer)


async def _end(
    request: Request,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    spec: ChaosSpec,
    ending: Ending,
) -> bool:
    """End a stream's body as ``ending`` says; return whether the connection can serve
    another request ("close": no last chunk, and the connection closes)."""
    if ending == "end":
        writer.write(LAST_CHUNK)
        await drain(writer)
        return request.keep_alive
    if ending == "reset":
        await reset(writer)
    elif ending == "stall":
        await stall(reader, spec.stall_s)
    return False


async def _reply(writer: asyncio.StreamWriter, request: Request, status: int, body: bytes) -> bool:
    await send_json(writer, status, body, close=not request.keep_alive)
    return request.keep_alive
