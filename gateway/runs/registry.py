"""The runs of one process: each relayed in its own task, checkpointed, drained at exit.

A run outlives its client's connection (``LocalRun``, gateway/durable.py): this
registry holds the runs this process relays, their checkpoint writer, and the
names clients know them by (``Aliases``). It lets them finish at shutdown, up to
the drain timeout, and then stops the rest with an error that says where to
resume them. Resuming, here or from another replica, is gateway/resume.py.

It also bounds what runs nobody reads keep in memory (``state.detached_memory``):
a run is *held* from when its last client leaves (or every follower was left
behind, reading nothing) until a client reads it again or it is forgotten; ``held``
sums their logs, kept exact as they grow (``grew``, per event of a held run only).
Past the budget, the oldest finished runs kept for late resumers (no store) are let
go first; then the run whose detach, or whose event, takes the sum past it is
stopped, as its detach grace ending would stop it. That run, not an older one
that fits: a run still growing with nobody reading is what fills memory (a client
that never reads), and a run that has just lost its client should not push out
runs that were there before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Callable, Iterator

from gateway.checkpoint.store import CheckpointStore
from gateway.checkpoint.writer import CheckpointWriter
from gateway.config.schema import State
from gateway.errors import ServiceUnavailable, ShuttingDown
from gateway.metrics import Metrics
from gateway.protocols import Adapter
from gateway.recovery.classify import Cause
from gateway.runs.aliases import Aliases
from gateway.runs.durable import LocalRun
from gateway.runs.log import RunLog
from gateway.runs.run import Run

logger = logging.getLogger("gateway.resume")

WRITE_TIMEOUT = 2.0  # seconds a checkpoint write may take, besides waiting for replicas
# Large logs freed (bytes) before the heap's free pages are given back to the system,
# TRIM_DELAY later (so logs freed together cost one trim): a pause of ~10 ms per 200 MB
# of heap, after tens of MB of answers, never per event.
TRIM_AFTER = 16 * 1024 * 1024
TRIM_LOG = 1024 * 1024  # a log this large is watched until it is freed
TRIM_DELAY = 0.5


class RunMoved(ServiceUnavailable):
    """This replica lost a run to another one (its writes were fenced out)."""

    code = "run_moved"


class Runs:
    def __init__(
        self,
        config: State,
        store: CheckpointStore | None,
        *,
        metrics: Metrics,
        max_client_lag: int = 1024 * 1024,
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.max_client_lag = max_client_lag  # bytes a follower may fall behind its run
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        owner_key = config.owner_key.get_secret_value().encode() if config.owner_key else None
        self.writer = (
            CheckpointWriter(
                store,
                metrics,
                lease_ttl=config.lease_ttl,
                owner_key=owner_key,
                # A write may wait for replicas (Redis WAIT) on top of its own time.
                write_timeout=WRITE_TIMEOUT + (config.wait_timeout if store.shared else 0),
                unprotected_after=config.unprotected_after,
            )
            if store is not None
            else None
        )
        self.local: dict[str, LocalRun] = {}
        self.held = 0  # bytes of the logs of the runs no client reads (detached_memory)
        self._finished: dict[str, LocalRun] = {}  # held and finished, oldest first
        self._kept: dict[str, asyncio.TimerHandle] = {}  # finished, kept for completed_ttl
        self._freed = 0  # bytes of logs let go since the heap was last trimmed
        self._trim: asyncio.TimerHandle | None = None
        self._malloc_trim = malloc_trim()
        self.stopping = False  # the drain deadline passed: runs end here
        self._busy = 0  # requests opening a run, and tails: the drain waits for them too
        self.aliases = Aliases(config, store)

    def start(self) -> None:
        if self.writer is not None:
            self.writer.start()

    def adopt(
        self,
        run: Run,
        credential: str | None,
        log: RunLog | None = None,
        *,
        created: float | None = None,
        resume: Cause | None = None,
        epoch: int = 0,
    ) -> LocalRun:
        """Relay ``run`` in its own task, so that it outlives its client connection."""
        gated = self.shared and self.config.durability == "sync"
        local = LocalRun(
            self,
            run,
            log or RunLog(run.adapter, gated=gated),
            credential=credential,
            created=created,
            resume=resume,
            epoch=epoch,
        )
        self.local[run.id] = local
        local.start_grace()  # cancelled by the first follower to attach
        if self.stopping:  # past the drain deadline: checkpointed for another replica
            local.stop()
        return local

    @contextlib.contextmanager
    def in_progress(self) -> Iterator[None]:
        """Around work the drain waits for: a request opening a run, a tail follower."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    def alias(self, name: object, local: LocalRun) -> None:
        """Let ``name``, the answer's own id, find ``local``'s run (on any replica)."""
        self.aliases.name(name, local)

    def ended(self, local: LocalRun) -> None:
        # The last checkpoint: final status, lease released. The in-memory store takes
        # it in this call, so a resume finds the run here or in the store, never neither.
        # A run lost to another replica writes nothing more: the checkpoint is the new owner's.
        if self.writer is not None and not local.lost and not self.writer.write_in_process(local):
            local.checkpoint()
        self.aliases.ended(local)
        if self.store is not None or local.status == "detached":
            # The store serves late resumers (a replay, or a takeover if detached);
            # keeping the log here too would hold every answer twice for completed_ttl.
            self._forget(local)
            return
        # No store: a client that dropped just before the end can still fetch it here.
        loop = asyncio.get_running_loop()
        self._kept[local.id] = loop.call_later(self.config.completed_ttl, self._forget, local)
        if local.held:
            self._finished[local.id] = local

    def _forget(self, local: LocalRun) -> None:
        if self.local.get(local.id) is local:
            del self.local[local.id]
        # A follower left behind (reading nothing) holds the log until it goes, at most
        # listen.send_timeout: the log stays held until it is freed, not forgotten.
        lingers = local.held and local.log.unread
        if lingers:
            local.held = False
        else:
            self.unhold(local)
        self._finished.pop(local.id, None)
        kept = self._kept.pop(local.id, None)
        if kept is not None:
            kept.cancel()
        self.aliases.forget(local)
        size = local.log.size
        if lingers or (size >= TRIM_LOG and self._malloc_trim is not None):
            freed = weakref.finalize(local.log, self._freed_log, size, lingers)
            freed.atexit = False

    def _freed_log(self, size: int, held: bool) -> None:
        """A forgotten log was freed: no longer held, and (a large one) worth a trim."""
        if held:
            self.held -= size
            self.metrics.detached_bytes.dec(size)
        if self._malloc_trim is None:
            return
        self._freed += size
        if self._freed >= TRIM_AFTER and self._trim is None:
            with contextlib.suppress(RuntimeError):  # no loop: the process is ending
                self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY, self._trim_heap)

    def _trim_heap(self) -> None:
        """Give the heap's free pages back: without it, the memory of a large answer once
        freed is reused by this process but never returned (RSS stays at its peak)."""
        self._trim, self._freed = None, 0
        if self._malloc_trim is not None:
            self._malloc_trim(0)

    # -- the detached memory budget ---------------------------------------------------

    def hold(self, local: LocalRun) -> None:
        """No client reads ``local`` any more: its log counts against detached_memory."""
        if local.held or self.local.get(local.id) is not local:
            return  # held already, or forgotten (its events are the store's)
        local.held = True
        size = local.log.size
        self.held += size
        self.metrics.detached_bytes.inc(size)
        if local.task.done():
            self._finished[local.id] = local
        if self.held > self.config.detached_memory:
            self._over_budget(local)

    def unhold(self, local: LocalRun) -> None:
        """A client reads ``local`` again (or it is forgotten): it is not held."""
        if local.held:
            local.held = False
            size = local.log.size
            self.held -= size
            self.metrics.detached_bytes.dec(size)
            self._finished.pop(local.id, None)

    def grew(self, local: LocalRun, size: int) -> None:
        """A held run's log grew by ``size`` bytes (per event: nothing else here)."""
        self.held += size
        self.metrics.detached_bytes.inc(size)
        if self.held > self.config.detached_memory:
            self._over_budget(local)

    def _over_budget(self, local: LocalRun) -> None:
        """Let go of the oldest finished runs, then stop ``local`` if it still does not fit."""
        budget, evicted = self.config.detached_memory, self.metrics.detached_evicted
        while self.held > budget and self._finished:
            oldest = next(iter(self._finished.values()))
            self._forget(oldest)  # no store (else not kept): a late resume gets 404
            evicted.labels("finished").inc()
        if self.held > budget and local.held and not local.evicted and not local.task.done():
            if not local.log.unread:
                self.unhold(local)  # its memory goes with its task, within a turn of the loop
            local.evict()
            evicted.labels("over_budget").inc()
            logger.warning(
                "detached memory full: a run is stopped",
                extra={"run_id": local.id, "run_bytes": local.log.size, "held_bytes": self.held},
            )

    # -- shutdown -------------------------------------------------------------------

    async def drain(self, grace: float) -> None:
        """Let running runs finish for up to ``grace`` seconds, then stop the rest.

        Not ``asyncio.timeout``: what happens at the deadline is the point.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        running = self._running()
        logger.info("draining", extra={"runs": len(running), "drain_timeout_s": grace})
        while (running or self._busy) and (left := deadline - loop.time()) > 0:
            if running:
                await asyncio.wait(running, timeout=left)
            else:
                await asyncio.sleep(min(left, 0.05))
            running = self._running()  # and any a request already in flight started
        self.stopping = True
        if running:
            logger.warning(
                "drain timeout: stopping runs",
                extra={"runs": len(running), "resumable": self.shared},
            )
            for local in list(self.local.values()):
                local.stop()
            await asyncio.gather(*running, return_exceptions=True)

    def _running(self) -> list[asyncio.Task[None]]:
        return [local.task for local in self.local.values() if not local.task.done()]

    @property
    def shared(self) -> bool:
        """Other replicas read this process's checkpoints (a Redis store)."""
        return self.store is not None and self.store.shared

    def shutdown_event(self, run_id: str, adapter: Adapter, events: int) -> bytes:
        """What a client of a run stopped by the drain receives last (after ``events``)."""
        if self.shared:
            message = (
                f"This gateway replica is shutting down; run {run_id} was checkpointed. "
                f"Resume it on another replica: {_how_to_resume(run_id)}"
            )
        else:
            message = (
                "The gateway is shutting down and could not finish this answer within its "
                "drain timeout (listen.drain_timeout); the answer is incomplete."
            )
        return adapter.error_event(ShuttingDown(message), events)

    def evicted_event(self, run_id: str, adapter: Adapter, events: int) -> bytes:
        """What a follower that was left behind (it read nothing) of a run stopped for
        detached_memory receives last."""
        message = (
            f"Run {run_id} was stopped: nobody read it, and the gateway's memory for runs "
            "without a reading client (state.detached_memory) was full."
        )
        if self.store is not None:
            message += f" It was checkpointed; resume it: {_how_to_resume(run_id)}"
        return adapter.error_event(ServiceUnavailable(message, code="detached_memory_full"), events)

    def lost_event(self, run_id: str, adapter: Adapter, events: int) -> bytes:
        """What a client of a run another replica took over receives last here."""
        message = (
            f"Run {run_id} has moved to another gateway replica: this one was unresponsive "
            f"longer than its lease, and the run was taken over. Resume it: "
            f"{_how_to_resume(run_id)}"
        )
        return adapter.error_event(RunMoved(message), events)

    async def aclose(self) -> None:
        """Stop relaying: each run gets a last checkpoint another replica can resume."""
        running = [local.task for local in self.local.values() if not local.task.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if self._trim is not None:
            self._trim.cancel()
        await self.aliases.aclose()
        if self.writer is not None:
            await self.writer.aclose()
        if self.store is not None:
            await self.store.aclose()


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, which returns free pages inside the heap too (``free``
    returns only its top); None elsewhere (musl, macOS), where freed memory stays the
    process's to reuse."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def _how_to_resume(run_id: str) -> str:
    return (
        f"repeat the request with x-run-id: {run_id} and x-resume-from: <chunks received>, "
        f"or GET /v1/runs/{run_id}/events with Last-Event-ID."
    )
