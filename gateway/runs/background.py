"""A run's background responses: the provider's own resume (docs/recovery.md, "The
provider's own resume"; the ``Reattach`` strategy).

On an upstream that keeps them (``background``: OpenAI's own API and Azure by default), a
Responses leg the client lets the upstream store is asked as a background response: the
provider goes on generating with no reader, and streams the same response again from any
event. ``Background`` is what a run knows of them, and asks:

- ``request``: a leg's request, asked so; a 4xx naming ``background`` (an organisation
  under zero data retention, a server that does not know it) is ``refused``: the leg
  again in the foreground, and that upstream and model from then on;
- ``where``: after a break of the connection (never a refusal, a slow leg or a
  divergence), where the open leg's response is read again: after its last event
  received, once per break while the reads make progress;
- the responses nobody will read are cancelled: one left generating when the usual plans
  take over (``leave``), and the open one when the run is abandoned (``abandon``: its
  client gone past the detach grace, stopped, bounded out, drained), unless another
  replica holds the run now (``moved``) or the client asked for a background response
  itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from gateway.metrics import Metrics
from gateway.protocols.base import Adapter, ClientStream
from gateway.recovery.classify import Cause
from gateway.recovery.plan import Position
from gateway.upstream.client import UpstreamClient, UpstreamHTTPError
from gateway.upstream.routes import ResolvedLeg

logger = logging.getLogger("gateway.run")

# What breaks a connection, not the generation behind it: a background response is read
# again after these; a refusal, a slow leg or a divergence are the usual plans'.
REATTACHABLE = frozenset(
    {Cause.RESET, Cause.PROTOCOL, Cause.IDLE, Cause.TRUNCATED, Cause.REPLICA_LOST, Cause.DETACHED}
)
# Cancels sent on their own: held here until they end (a task only the loop references
# may be collected).
_CANCELS: set[asyncio.Task[None]] = set()


class Background:
    def __init__(
        self,
        run_id: str,
        upstreams: UpstreamClient,
        metrics: Metrics,
        authorization: str | None,
        *,
        client_asked: bool,
    ) -> None:
        self._run_id = run_id
        self._upstreams = upstreams
        self._metrics = metrics
        self._authorization = authorization
        self._client_asked = client_asked  # the client's own request says background
        self._asked = False  # the open request is one the gateway made a background one
        self._read_after: int | None = None  # the event the last read again followed
        self._ended: str | None = None  # a response found ended (a 4xx to reading it)
        self.moved = False  # another replica holds the run (fenced): its response is theirs

    def request(self, leg: ResolvedLeg, adapter: Adapter, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` for ``leg``: a background response where its upstream keeps them."""
        background = self._upstreams.runs_background(leg) and adapter.in_background(body)
        self._asked = bool(background) and not self._client_asked
        return background or body

    def refused(self, leg: ResolvedLeg, exc: UpstreamHTTPError) -> bool:
        """Whether ``exc`` refuses the background response the gateway asked for (then
        remembered: the leg goes in the foreground from then on)."""
        if not self._asked or not 400 <= exc.status_code < 500 or exc.status_code == 429:
            return False
        if b"background" not in exc.content:
            return False
        self._upstreams.refuses_background(leg)
        logger.info(
            "background response refused; asking in the foreground",
            extra={"run_id": self._run_id, "upstream": leg.upstream.name},
        )
        return True

    def where(self, splicer: ClientStream, cause: Cause, *, fatal: bool) -> Position | None:
        """Where the open leg's response is read again after a break for ``cause``; None:
        not a background response, not the connection's break, or read again from there
        already and broken with nothing new."""
        position = splicer.resumable()
        if position is None or fatal or cause not in REATTACHABLE:
            return None
        if self._read_after is not None and position.after <= self._read_after:
            return None
        self._read_after = position.after
        return position

    def ended(self, position: Position, status: int | None) -> None:
        """Reading ``position``'s response again was answered ``status``: a 4xx says it is
        gone or over (nothing to cancel)."""
        if status is not None and status < 500:
            self._ended = position.response

    def leave(self, leg: ResolvedLeg, splicer: ClientStream, cause: Cause) -> None:
        """The usual plans follow a break: the broken leg's response, if it may still be
        generating, is cancelled on its own."""
        position = splicer.resumable()
        if position is None or position.response == self._ended:
            return
        if cause is not Cause.IN_BAND_ERROR:  # else it failed upstream
            self.cancel_later(leg, position.response)

    def cancel_later(self, leg: ResolvedLeg, response: str) -> None:
        task = asyncio.create_task(self._cancel(leg, response))
        _CANCELS.add(task)
        task.add_done_callback(_CANCELS.discard)

    async def abandon(self, leg: ResolvedLeg, splicer: ClientStream) -> None:
        """The run stops before its answer's end: the open leg's response is cancelled
        (within ``CANCEL_TIMEOUT``; never raises), unless the run moved, or the client
        asked for a background response itself (it may read it later, from the
        provider)."""
        position = splicer.resumable()
        if position is not None and not self.moved and not self._client_asked:
            with contextlib.suppress(Exception):
                await self._cancel(leg, position.response)

    async def _cancel(self, leg: ResolvedLeg, response: str) -> None:
        status = await self._upstreams.cancel_response(leg, response, self._authorization)
        outcome = "failed" if status is None or status >= 400 else "cancelled"
        self._metrics.upstream_cancels.labels(leg.upstream.name, outcome).inc()
        logger.info(
            "upstream background response cancelled",
            extra={"run_id": self._run_id, "upstream": leg.upstream.name, "status": status},
        )
