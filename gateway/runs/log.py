"""The client events of one run, numbered from 1, and the followers that read them.

A run's producer appends; followers read from an offset, the live case one event at
a time without a copy, a slow one's backlog in one write. Gated (``durability:
sync``), followers see only what the checkpoint store acknowledged (``release``).
The log is also where back-pressure lives: the producer waits while a follower is
far behind (``make_room``), so a client that does not read stops the upstream read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

from gateway.checkpoint.model import split_events
from gateway.protocols import Adapter


def render(numbered: Iterable[tuple[int, bytes]], *, ids: bool) -> bytes:
    """Numbered events as one write; with ``id: N`` lines when the client asked for ids."""
    if ids:
        return b"".join(b"id: %d\n%s" % (n, event) for n, event in numbered)
    return b"".join(event for _, event in numbered)


class _Reader:
    """A follower's place in the log, in bytes: how far behind the run it is."""

    __slots__ = ("consumed", "left_behind")

    def __init__(self, consumed: int) -> None:
        self.consumed = consumed
        self.left_behind = False  # read nothing for too long: no longer waited for


class RunLog:
    """The client events of one run, and the followers waiting for more.

    Back-pressure: the producer waits (``make_room``) while a follower is more than
    ``limits.max_client_lag_bytes`` behind, so the run stops reading its upstream
    (whose TCP window then closes) instead of piling up what a client does not
    read. A follower that reads nothing for ``patience`` is left behind: the run
    goes on as if detached (``unread``: its log then counts against the detached
    memory budget), and the follower still gets it all if it reads again.

    ``size`` is the bound's measure (``state.max_run_bytes``, ``LocalRun._emit``): the
    events' bytes, summed as they are appended, without the list's own cost.
    """

    def __init__(
        self,
        adapter: Adapter,
        events: list[bytes] | None = None,
        *,
        gated: bool = False,
    ) -> None:
        self.keepalive = adapter.keepalive  # what a silent stream without ids is sent
        self.events: list[bytes] = events if events is not None else []
        self.size = sum(map(len, self.events))  # bytes of all events
        # Followers read events[:visible]. Gated (durability: sync), an event becomes
        # visible once the checkpoint holding it is acknowledged (``release``).
        self.gated = gated
        self.visible = len(self.events)
        self.closed = False
        self.abandoned = False  # closed with events that will never be released
        self._waiters: list[asyncio.Future[bool]] = []
        self._readers: set[_Reader] = set()
        self._floor = 0  # what every waited-for reader has consumed, at least
        self._room: asyncio.Future[None] | None = None  # the producer waits on it

    def append(self, data: bytes) -> None:
        """One or more complete events, as the run yields them."""
        if data.count(b"\n\n") == 1:
            self.events.append(data)
        else:
            self.events.extend(split_events(data))
        self.size += len(data)
        if not self.gated:
            self.visible = len(self.events)
            self._wake()

    def release(self, count: int) -> None:
        """The first ``count`` events are checkpointed: followers may read them."""
        count = min(count, len(self.events))
        if count > self.visible:
            self.visible = count
            self._wake()

    def abandon(self) -> None:
        """What is not visible yet never will be (the run moved to another replica)."""
        self.abandoned = True
        self._wake()

    def lagging(self, limit: int) -> bool:
        """Whether a follower may be more than ``limit`` bytes behind (cheap, per event)."""
        return self.size - self._floor > limit and self._lag() > limit

    async def make_room(self, limit: int, patience: float) -> None:
        """Wait until every follower is within ``limit // 2`` bytes, or is left behind."""
        loop = asyncio.get_running_loop()
        while self._lag() > limit // 2:
            self._room = loop.create_future()
            try:
                async with asyncio.timeout(patience):
                    await self._room
            except TimeoutError:
                floor = self._floor
                for reader in self._readers:
                    if reader.consumed == floor:
                        reader.left_behind = True
            finally:
                self._room = None

    @property
    def unread(self) -> bool:
        """Whether every follower was left behind: nobody reads the run, as if detached."""
        return bool(self._readers) and all(r.left_behind for r in self._readers)

    def _lag(self) -> int:
        waited = [r.consumed for r in self._readers if not r.left_behind]
        self._floor = min(waited) if waited else self.size
        return self.size - self._floor

    def _progress(self, reader: _Reader, consumed: int) -> None:
        reader.consumed += consumed
        if self._room is not None and not self._room.done():
            self._room.set_result(None)  # make_room checks the lag again

    def close(self) -> None:
        self.closed = True
        self._wake()

    def ping(self) -> None:
        """Nothing new for a while: followers without event ids send a keepalive (a
        comment, or the protocol's ping event; a Gemini stream gets none)."""
        self._wake(idle=True)

    def _wake(self, *, idle: bool = False) -> None:
        if self._waiters:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(idle)
            self._waiters.clear()

    async def follow(self, after: int, *, ids: bool) -> AsyncIterator[bytes]:
        """Events numbered above ``after``, then the live rest, until the log closes.

        Events that piled up while the client was slow go out in one write. ``after``
        is at most the log's length: a client holding more cannot be placed
        (``Runs.resume`` refuses it).
        """
        if after > len(self.events):
            raise ValueError(f"a follower at {after} of a log of {len(self.events)} events")
        seq = after
        loop = asyncio.get_running_loop()
        reader = _Reader(sum(map(len, self.events[:seq])))
        self._readers.add(reader)
        try:
            while True:
                events, visible = self.events, self.visible
                if seq < visible:
                    batch = events[seq:visible]
                    if ids or len(batch) > 1:
                        yield render(enumerate(batch, seq + 1), ids=ids)
                        self._progress(reader, sum(map(len, batch)))
                    else:
                        yield batch[0]  # the live case: one event, no copy
                        self._progress(reader, len(batch[0]))
                    seq += len(batch)
                elif self.closed and (visible == len(events) or self.abandoned):
                    return
                else:
                    waiter = loop.create_future()
                    self._waiters.append(waiter)
                    if await waiter and not ids and self.keepalive:
                        yield self.keepalive
        finally:
            self._readers.discard(reader)
            if self._room is not None and not self._room.done():
                self._room.set_result(None)
