"""The checkpoint store interface, and the in-memory store (the embedded default).

A store keeps each run's record, event log, state and lease (see ``model``), and
lets another replica tail the log and take a run over. The writer calls ``write``
with many runs' flushes at once; a store sends them in one round trip.

Writes are fenced: each claim of a run raises its *epoch*, and a flush applies only
while its epoch is the run's current one. A replica paused past its lease (a long
GC pause, SIGSTOP, a frozen VM) wakes up with an old epoch, so once another
replica has taken the run over, its writes are refused (``Applied.FENCED``)
instead of overwriting the new owner's checkpoints. A run nobody ever claimed has
epoch 0 and stores none, so fencing costs a run that never moves one key read.

The in-memory store serves one process: it makes a run resumable after its
client left and after its detach grace ran out, with no Redis at all. It keeps
the same TTL and lease semantics as Redis so the same code paths run on both.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.checkpoint.model import Applied, Checkpoint, Flush, RunRecord, RunState, split_events


class CheckpointStore(Protocol):
    # Other processes (replicas) read what this one writes: a run this one stops
    # can be resumed elsewhere.
    shared: bool

    async def ping(self) -> None:
        """Raise if the store cannot be reached."""

    async def owner_key(self) -> bytes:
        """The key owner hashes are made with: the same on every replica of a store."""

    async def write(self, flushes: Sequence[Flush]) -> list[Applied]:
        """Apply flushes in one round trip; per flush, what was done with it."""

    async def load(self, run_id: str) -> Checkpoint | None: ...

    async def read_events(
        self, run_id: str, after: int, block: float = 0
    ) -> list[tuple[int, bytes]]:
        """Events numbered above ``after``; waits up to ``block`` seconds for one."""

    async def lease_holder(self, run_id: str) -> str | None: ...

    async def released(self, run_id: str) -> int | None:
        """How many of the run's events a tail may give its client (``RunState.released``);
        None when the run is not stored."""

    async def claim(self, run_id: str, claim: str, ttl: float) -> int | None:
        """Take a stored run whose lease expired; exactly one caller wins.

        The winner gets the run's new epoch, for its flushes: from then on the
        store refuses the flushes of every earlier holder. Losers get None.
        ``claim`` names this claim alone: the same claim sent twice wins twice.
        """

    async def watch(self, run_id: str, ttl: float) -> None:
        """Ask the owner to checkpoint every event for ``ttl`` seconds (a live tail)."""

    async def set_alias(self, name: str, run_id: str, ttl: float) -> None:
        """Let ``name`` (the id a client saw, e.g. a Responses response id) find the run."""

    async def get_alias(self, name: str) -> str | None:
        """The run ``name`` was set for, if it has not expired."""

    async def aclose(self) -> None: ...


@dataclass
class _Run:
    record: bytes | None = None
    state: bytes | None = None
    events: list[bytes] = field(default_factory=list)
    # A finished run's events, joined and compressed: read again only by a late
    # resume, and kept for completed_ttl (at 400 runs/s, 24,000 answers).
    packed: bytes = b""
    expires: float = 0.0
    lease: str | None = None
    lease_expires: float = 0.0
    watch_expires: float = 0.0
    epoch: int = 0  # raised by each claim; 0: never claimed
    changed: asyncio.Event | None = None  # made when a reader waits for a write


SWEEP_INTERVAL = 1.0


def _notify(run: _Run) -> None:
    if run.changed is not None:
        run.changed.set()
        run.changed = None


def _unpack(packed: bytes) -> list[bytes]:
    return split_events(zlib.decompress(packed))


def _events(run: _Run) -> list[bytes]:
    return _unpack(run.packed) if run.packed else list(run.events)


class MemoryStore:
    shared = False

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._key = secrets.token_bytes(32)
        self._written = asyncio.Event()  # any write: for readers of a run not stored yet
        self._next_sweep = 0.0
        self._aliases: dict[str, tuple[str, float]] = {}  # name: (run id, expiry)

    def _get(self, run_id: str) -> _Run | None:
        run = self._runs.get(run_id)
        if run is not None and run.expires <= time.monotonic():
            del self._runs[run_id]
            return None
        return run

    async def ping(self) -> None:
        return None

    async def owner_key(self) -> bytes:
        return self._key

    async def write(self, flushes: Sequence[Flush]) -> list[Applied]:
        return self.put(flushes)

    @property
    def key(self) -> bytes:
        return self._key

    def put(self, flushes: Sequence[Flush]) -> list[Applied]:
        """``write``, in this call: nothing here waits."""
        now = time.monotonic()
        applied = []
        for flush in flushes:
            run = self._runs.get(flush.run_id)
            if run is not None and run.expires <= now:  # expired: gone, as Redis keys are
                _notify(run)
                run = None
            if run is None:
                run = self._runs[flush.run_id] = _Run()
            elif run.epoch and run.epoch != flush.epoch:
                applied.append(Applied.FENCED)
                continue
            if flush.epoch:
                run.epoch = flush.epoch
            if flush.ttl <= 0:
                if run.epoch:  # as in Redis, the epoch outlives the run: stale writers stay out
                    self._runs[flush.run_id] = _Run(expires=run.expires, epoch=run.epoch)
                else:
                    del self._runs[flush.run_id]
                _notify(run)
                applied.append(Applied.WRITTEN)
                continue
            if flush.reset:
                run.events.clear()
                run.packed = b""
            if flush.record is not None:
                # Copies the size of the JSON, not orjson's 4 KB buffers (see run.py).
                run.record = bytes(memoryview(flush.record))
            if flush.events and flush.lease is None and flush.first_seq == 1:
                # A whole run as it ends (this store's usual only write): packed from the
                # flush as it is, not split into events and joined again (two copies of a
                # long answer at once).
                run.events, run.packed = [], zlib.compress(flush.events, 1)
            elif flush.events:
                if run.packed:  # taken over after it was detached: the log grows again
                    run.events, run.packed = _unpack(run.packed), b""
                del run.events[flush.first_seq - 1 :]
                run.events.extend(split_events(flush.events))
            if flush.lease is None and run.events:  # it ended (or was detached)
                run.packed = zlib.compress(b"".join(run.events), 1)
                run.events = []
            run.state = bytes(memoryview(flush.state))
            run.expires = now + flush.ttl
            run.lease = flush.lease
            run.lease_expires = now + flush.lease_ttl
            _notify(run)
            applied.append(Applied.WATCHED if run.watch_expires > now else Applied.WRITTEN)
        self._written.set()
        self._written = asyncio.Event()
        if now >= self._next_sweep:
            # Forget expired runs, so a long-lived process does not grow; once a second,
            # not per write: finished runs stay for completed_ttl, thousands at load.
            self._next_sweep = now + SWEEP_INTERVAL
            for run_id in [k for k, r in self._runs.items() if r.expires <= now]:
                del self._runs[run_id]
            for name in [k for k, (_, e) in self._aliases.items() if e <= now]:
                del self._aliases[name]
        return applied

    async def load(self, run_id: str) -> Checkpoint | None:
        run = self._get(run_id)
        if run is None or run.record is None or run.state is None:
            return None
        return Checkpoint(RunRecord.decode(run.record), RunState.decode(run.state), _events(run))

    async def read_events(
        self, run_id: str, after: int, block: float = 0
    ) -> list[tuple[int, bytes]]:
        deadline = time.monotonic() + block
        while True:
            run = self._get(run_id)
            events = _events(run) if run is not None else []
            if len(events) > after:
                return [(seq, event) for seq, event in enumerate(events, 1) if seq > after]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if run is None:
                changed = self._written
            else:
                changed = run.changed = run.changed or asyncio.Event()
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return []

    async def lease_holder(self, run_id: str) -> str | None:
        run = self._get(run_id)
        if run is None or run.lease_expires <= time.monotonic():
            return None
        return run.lease

    async def released(self, run_id: str) -> int | None:
        run = self._get(run_id)
        if run is None or run.state is None:
            return None
        return RunState.decode(run.state).released()

    async def claim(self, run_id: str, claim: str, ttl: float) -> int | None:
        run = self._get(run_id)
        holder = await self.lease_holder(run_id)
        if run is not None and holder == claim:
            return run.epoch
        if run is None or run.state is None or holder is not None:
            return None
        run.lease, run.lease_expires = claim, time.monotonic() + ttl
        run.epoch += 1
        return run.epoch

    async def watch(self, run_id: str, ttl: float) -> None:
        run = self._get(run_id)
        if run is not None:
            run.watch_expires = time.monotonic() + ttl

    async def set_alias(self, name: str, run_id: str, ttl: float) -> None:
        self._aliases[name] = (run_id, time.monotonic() + ttl)

    async def get_alias(self, name: str) -> str | None:
        run_id, expires = self._aliases.get(name, ("", 0.0))
        return run_id if expires > time.monotonic() else None

    def memory_bytes(self, run_id: str) -> int:
        """The bytes a run's events take here (the in-memory store's cost per run)."""
        run = self._runs.get(run_id)
        return 0 if run is None else len(run.packed) + sum(len(e) for e in run.events)

    async def aclose(self) -> None:
        self._runs.clear()
