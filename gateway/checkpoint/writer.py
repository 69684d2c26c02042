"""Checkpoint writes that never slow the relay.

A run only *marks* itself due (a dict insert and an event set, no I/O). One task
per process takes every due run, asks each for what changed since its last
checkpoint, and sends them all to the store in one round trip. Marks
that arrive while a write is in flight coalesce: the next write carries the
newest state of each run, once. A slow store delays checkpoints, never chunks.

When the store fails, the writer retries with backoff, and a run's events that
wait for their checkpoint (``durability: sync``) wait on for ``unprotected_after``
seconds: long enough for a Redis failover, after which the checkpoint lands on
the new primary and nothing a client has was lost. Then they go out unprotected
(``LocalRun.unflushed``): the failure is counted, and one warning is logged for
the whole outage. The first write after an outage rewrites each run whole
(record and full log), because a restarted or promoted Redis may have lost what
it had; so does the first write to a new primary (a Sentinel failover).

A write that no replica acknowledged in time (``Applied.UNREPLICATED``) is not
acknowledged: its events wait as through a failure, and the write is sent again
(the store takes it again without harm), until a replica acknowledges it or
``unprotected_after`` has passed; then they go out, counted apart. A primary that
lost its replicas, or a deposed one that woke up still a primary, is so never
trusted with what a client will read; the hold is what a lagging replica costs.

Every write renews the writer's leases on its runs; runs with nothing new get a
heartbeat write every third of the lease TTL, so a silent owner is a dead one.
A write the store refuses because another replica took the run over (fencing, see
``store``) ends this writer's part in that run: the run is told, and never
written or heartbeaten here again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Protocol

from gateway.checkpoint.model import Applied, Flush
from gateway.checkpoint.store import CheckpointStore, MemoryStore
from gateway.metrics import Metrics

logger = logging.getLogger("gateway.checkpoint")

RESEND = 0.05  # seconds before an unacknowledged write is sent again


class Checkpointed(Protocol):
    """A run the writer checkpoints (``gateway.runs.durable.LocalRun``)."""

    id: str
    last_write: float  # loop time of the last committed write

    def flush(self, owner_key: bytes, *, rewrite: bool) -> Flush: ...

    def flushed(self, flush: Flush, watched: bool) -> None: ...

    def unflushed(self) -> None:
        """A write of the run failed (the store is down): it goes on unprotected."""

    def fenced(self) -> None:
        """Another replica took the run over: stop relaying it, write nothing more."""


class CheckpointWriter:
    def __init__(
        self,
        store: CheckpointStore,
        metrics: Metrics,
        *,
        lease_ttl: float,
        owner_key: bytes | None = None,
        write_timeout: float = 2.0,
        unprotected_after: float = 0.0,
    ) -> None:
        self.store = store
        self._metrics = metrics
        self._heartbeat = lease_ttl / 3
        self._timeout = write_timeout
        self._hold = unprotected_after
        self._failing: dict[str, float] = {}  # run id: loop time its writes began to fail
        self._outage = 0.0  # loop time the whole store began to fail (while not healthy)
        self._owner_key = owner_key
        self._due: dict[str, Checkpointed] = {}
        self._owned: dict[str, Checkpointed] = {}  # runs whose lease this writer renews
        self._next_heartbeats = 0.0  # loop time of the next scan for runs due a heartbeat
        self._rewrite: set[str] = set()  # runs whose last write failed alone (Applied.FAILED)
        self._primaries = 0  # primaries the store has had (its primary_changes)
        self._written_ok = metrics.checkpoint_writes.labels("ok")
        self._unreplicated = metrics.checkpoint_writes.labels("unreplicated")
        self._gaps = metrics.checkpoint_writes.labels("gap")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.healthy = True

    async def owner_key(self) -> bytes:
        if self._owner_key is None:
            self._owner_key = await self.store.owner_key()
        return self._owner_key

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="checkpoints")

    @property
    def protecting(self) -> bool:
        """Whether events still wait for their checkpoint: the store is healthy, or has
        failed for less than ``unprotected_after`` (it may be failing over)."""
        if self.healthy:
            return True
        return asyncio.get_running_loop().time() - self._outage < self._hold

    def mark(self, run: Checkpointed) -> None:
        """``run`` has something to checkpoint: written with the next batch."""
        self._due[run.id] = run
        self._owned[run.id] = run
        self._wake.set()

    def write_in_process(self, run: Checkpointed) -> bool:
        """Write ``run`` in this call if the store is in this process; else False."""
        store = self.store
        if not isinstance(store, MemoryStore):
            return False
        if self._owner_key is None:
            self._owner_key = store.key
        self._due.pop(run.id, None)
        flush = run.flush(self._owner_key, rewrite=False)
        [applied] = store.put([flush])
        if applied is Applied.FENCED:
            self._fenced(run)
        else:
            self._written_ok.inc()
            run.flushed(flush, applied is Applied.WATCHED)
        return True

    def disown(self, run_id: str) -> None:
        """The run's last checkpoint was written (or it is gone): no more heartbeats."""
        self._owned.pop(run_id, None)
        self._failing.pop(run_id, None)

    async def _loop(self) -> None:
        backoff = 0.1
        while not self._closing:
            try:
                async with asyncio.timeout(self._heartbeat):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self._closing:
                return
            try:
                written = await self.write_due()
            except Exception:  # a bug, not the store: streams must not wait on a dead writer
                logger.exception("checkpoint writer failed; streams go on without checkpoints")
                self.healthy = False
                self._outage = -math.inf
                for run in {**self._owned, **self._due}.values():
                    run.unflushed()
                written = False
            if written:
                backoff = 0.1
            else:
                await asyncio.sleep(backoff)  # the store is down: retry, a little later each time
                backoff = min(backoff * 2, 1.0)

    async def write_due(self) -> bool:
        """Write every due run (and heartbeats) in one round trip; False if the store failed."""
        now = asyncio.get_running_loop().time()
        if now >= self._next_heartbeats:
            # A scan of every owned run, a few times per heartbeat period, not per write:
            # a busy writer writes thousands of times a second.
            self._next_heartbeats = now + self._heartbeat / 4
            for run in self._owned.values():
                if now - run.last_write >= self._heartbeat * 3 / 4:
                    self._due.setdefault(run.id, run)
        if not self._due:
            return True
        batch = list(self._due.values())
        self._due.clear()
        started = time.perf_counter()
        # A failure's hold counts from here: a store that hangs until the timeout has
        # held these events since the write began, not since it gave up.
        began = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(self._timeout):
                key = await self.owner_key()
                flushes = [
                    run.flush(key, rewrite=not self.healthy or run.id in self._rewrite)
                    for run in batch
                ]
                applied = await self.store.write(flushes)
        except Exception as exc:  # noqa: BLE001 - any store failure: go on without it
            self._metrics.checkpoint_writes.labels("error").inc(len(batch))
            now = asyncio.get_running_loop().time()
            if self.healthy:
                self._outage = began
            for run in batch:
                self._due.setdefault(run.id, run)
                self._failed(run, began, now)
            if self.healthy:
                self.healthy = False
                logger.warning(
                    "checkpoint store unavailable (%s); streams wait for it %gs (a failover), "
                    "then go on without checkpoints until it is back",
                    type(exc).__name__,
                    self._hold,
                )
            return False
        self._metrics.checkpoint_write_seconds.observe(time.perf_counter() - started)
        if not self.healthy:
            self.healthy = True
            logger.warning("checkpoint store reachable again; checkpoints resumed")
        written = failed = held = 0
        failing = bool(self._rewrite)
        now = asyncio.get_running_loop().time()
        primaries = getattr(self.store, "primary_changes", 0)
        if primaries != self._primaries:
            # A new primary may not have had the last writes of any run: each is written
            # whole at its next write (those of this batch were written to it already).
            self._primaries = primaries
            self._rewrite.update(self._owned.keys())
        for run, flush, result in zip(batch, flushes, applied, strict=True):
            if result is Applied.FAILED:
                # The store failed for this run alone (its Cluster primary is down): as
                # when a whole write fails, for this run; the others' stand. It is
                # rewritten whole, as after an outage: a primary replaced by its replica
                # may have lost this run's last writes, or applied the one that failed.
                failed += 1
                self._due.setdefault(run.id, run)
                self._rewrite.add(run.id)
                self._failed(run, began, now)
                continue
            if result is Applied.GAP:
                # The store's log of it ends before what this write sent (a failover lost
                # the end, or it went out unacknowledged): rewritten whole, shortly.
                self._gaps.inc()
                self._rewrite.add(run.id)
                self._due.setdefault(run.id, run)
                held += 1
                continue
            if result is Applied.UNREPLICATED and self._held(run, began, now):
                # Not acknowledged: held as through a failure, and sent again shortly.
                self._unreplicated.inc()
                self._due.setdefault(run.id, run)
                held += 1
                continue
            self._rewrite.discard(run.id)
            if result is not Applied.UNREPLICATED:  # held long enough: the next go at once
                self._failing.pop(run.id, None)
            if result is Applied.FENCED:
                self._fenced(run)
            elif result is Applied.UNREPLICATED:
                self._unreplicated.inc()
                run.flushed(flush, False)  # held past unprotected_after: it goes out, counted
            else:
                written += 1
                run.flushed(flush, result is Applied.WATCHED)
        self._written_ok.inc(written)
        if held:  # sent again soon: a replica catching up, or the store finding its primary
            asyncio.get_running_loop().call_later(RESEND, self._wake.set)
        if failed:
            self._metrics.checkpoint_writes.labels("error").inc(failed)
            if not failing:
                logger.warning(
                    "checkpoint store partly unavailable: %d of %d runs not written; they "
                    "go on without checkpoints until their part of it is back",
                    failed,
                    len(batch),
                )
        elif failing and not self._rewrite:
            logger.warning("checkpoint store reachable again for every run; checkpoints resumed")
        return True

    def _failed(self, run: Checkpointed, began: float, now: float) -> None:
        """A write of ``run`` (begun at ``began``) failed: what it waits for goes out once
        its writes have failed for ``unprotected_after`` (a failover that ends sooner
        loses nothing)."""
        if now - self._failing.setdefault(run.id, began) >= self._hold:
            run.unflushed()

    def _held(self, run: Checkpointed, began: float, now: float) -> bool:
        """Whether an unacknowledged write of ``run`` still holds its events: for
        ``unprotected_after`` since its writes began to go unacknowledged."""
        return now - self._failing.setdefault(run.id, began) < self._hold

    def _fenced(self, run: Checkpointed) -> None:
        self._metrics.checkpoint_writes.labels("fenced").inc()
        # Only this run object: a later takeover of the same run here is another one.
        if self._due.get(run.id) is run:
            del self._due[run.id]
        if self._owned.get(run.id) is run:
            del self._owned[run.id]
        self._failing.pop(run.id, None)
        logger.warning(
            "run taken over by another replica while this one was unresponsive past its "
            "lease; stopping it here",
            extra={"run_id": run.id},
        )
        run.fenced()

    async def aclose(self) -> None:
        """Stop the loop and make one last attempt at what is due."""
        if self._task is not None:
            # A flag, not Task.cancel(): a cancellation that lands inside the heartbeat
            # timeout can be taken for the timeout and swallowed.
            self._closing = True
            self._wake.set()
            await self._task
            self._task = None
        if self._due:
            await self.write_due()
