"""A takeover's re-attach: the first leg's background response read again from its first
event, through a new splicer, until it has rendered every event the client was sent.

A takeover knows what the client has (the run's log), not where the last replica's
splicer stood in the upstream's events (held items, events not shown). So the whole
response is read again, which its provider serves from what it stored (no new
generation), and rendered as the first replica rendered it: the splicer is pure, so the
same events give the same bytes. ``CatchUp`` is the run's ``Emit`` meanwhile: what the
client has is checked byte for byte, never sent again, and the rest goes on to it. Any
difference (a provider that does not repeat itself exactly) raises ``NotTheSame``
before anything of it reached the client: the run goes back to its log's view and the
usual takeover plans.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.protocols.base import ClientStream
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.seam import SeamDiverged

# Where a run's client events go, one call per event (or batch of events): the durable
# run's log, or nowhere for a non-streaming run. It may return an awaitable the relay
# waits for before it reads on (back-pressure: a client far behind).
Emit = Callable[[bytes], Awaitable[None] | None]


class NotTheSame(SeamDiverged):
    """The response read again did not render the client's events."""


@dataclass(frozen=True, slots=True)
class Restored:
    """The run as rebuilt from its log, to go back to if the catch-up fails: its view,
    its emit, and the upstream response read again."""

    accumulator: RunAccumulator
    splicer: ClientStream
    emit: Emit
    response: str


class CatchUp:
    def __init__(self, events: list[bytes], restored: Restored) -> None:
        self._had = b"".join(events)
        self._at = 0  # bytes of ``_had`` rendered again so far
        self._emit = restored.emit
        self.restored = restored

    @property
    def caught_up(self) -> bool:
        return self._at == len(self._had)

    def __call__(self, data: bytes) -> Awaitable[None] | None:
        at, had = self._at, self._had
        if at < len(had):
            n = min(len(data), len(had) - at)
            if data[:n] != had[at : at + n]:
                raise NotTheSame
            self._at = at + n
            data = data[n:]
            if not data:
                return None
        return self._emit(data)
