"""The runs of one process: each relayed in its own task, checkpointed, drained at exit.

A run outlives its client's connection (``LocalRun``, gateway/durable.py): this
registry holds the runs this process relays, their checkpoint writer, and the
names clients know them by (``Aliases``). It lets them finish at shutdown, up to
the drain timeout, and then stops the rest with an error that says where to
resume them. Resuming, here or from another replica, is gateway/resume.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Iterator

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
        loop.call_later(self.config.completed_ttl, self._forget, local)

    def _forget(self, local: LocalRun) -> None:
        self.local.pop(local.id, None)
        self.aliases.forget(local)

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
        await self.aliases.aclose()
        if self.writer is not None:
            await self.writer.aclose()
        if self.store is not None:
            await self.store.aclose()


def _how_to_resume(run_id: str) -> str:
    return (
        f"repeat the request with x-run-id: {run_id} and x-resume-from: <chunks received>, "
        f"or GET /v1/runs/{run_id}/events with Last-Event-ID."
    )
