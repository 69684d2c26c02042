"""A streaming run that outlives its client connection.

The run is relayed by its own task (the *producer*) into a ``RunLog`` (``log.py``): the
client's SSE events, numbered from 1. Clients are *followers* of the log from an
offset: the one that started the run from 0, a reconnecting one from what it
already has. When the last follower leaves, the run goes on for the detach grace
period, so a reconnect finds it live; then it is cancelled and its upstream
closed, after a last checkpoint that lets a later resume continue it.

Checkpoints: with Redis and ``durability: sync`` (the default), the log is
*gated*: the producer marks the run due with every event, and followers see an
event only once the write holding it is acknowledged (``RunLog.release``; group
commit: the writer's one batch per tick carries every run's pending events) by
the primary and, where it has one, a replica (Redis WAIT), so no client is ever
ahead of the store, even across a failover. If the store fails for longer than
``unprotected_after``, what waits is released unprotected. With ``durability:
async`` the producer marks the run due with its first event, then every
``checkpoint_every`` content deltas, on each interruption and at the end
(every event while another replica tails it). The writer (``checkpoint.writer``)
does the I/O. The in-memory store gets the last one only,
written as the run ends.
Writes carry the run's epoch (0, or what this process's claim returned): if this
process was paused past its lease and another replica took the run over, the
store refuses them, and the run ends here with a ``run_moved`` error event.

Bounds (``state.max_run_bytes``, ``state.detached_memory``): the log's size is checked
as each event is appended (``RunLog.size`` is summed there anyway); a run past its
limit ends with the protocol's own error (``RunTooLarge``, raised out of ``_emit`` into
the relay, which ends the stream with the splicer's ``fail``). A run no client reads is
*held*: its log counts against the process's budget for such runs (``Runs.hold``).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from gateway.checkpoint.model import (
    FINAL_STATUSES,
    Flush,
    InFlightCall,
    RunRecord,
    RunState,
    Status,
    owner_hash,
)
from gateway.checkpoint.writer import CheckpointWriter
from gateway.config.schema import State
from gateway.errors import GatewayError
from gateway.metrics import Metrics
from gateway.protocols import Adapter
from gateway.recovery.classify import Cause
from gateway.runs.log import RunLog
from gateway.runs.run import Run


class RunTooLarge(GatewayError):
    """A run's client events passed ``state.max_run_bytes``: the answer ends here."""

    code = "run_too_large"


class Host(Protocol):
    """What a ``LocalRun`` needs of the runs of its process (``gateway.runs.registry.Runs``)."""

    config: State
    metrics: Metrics
    writer: CheckpointWriter | None
    replica: str  # this process's name, on the leases of its runs
    max_client_lag: int  # bytes a follower may fall behind its run

    @property
    def shared(self) -> bool:
        """Other replicas read this process's checkpoints (a Redis store)."""

    def alias(self, name: object, local: LocalRun) -> None:
        """Let ``name``, the answer's own id, find ``local``'s run."""

    def ended(self, local: LocalRun) -> None:
        """``local``'s producer has finished: its last checkpoint, and forgetting it."""

    def hold(self, local: LocalRun) -> None:
        """No client reads ``local`` any more: its log counts against detached_memory."""

    def unhold(self, local: LocalRun) -> None:
        """A client reads ``local`` again."""

    def grew(self, local: LocalRun, size: int) -> None:
        """A held run's log grew by ``size`` bytes."""

    def shutdown_event(self, run_id: str, adapter: Adapter, events: int) -> bytes: ...

    def lost_event(self, run_id: str, adapter: Adapter, events: int) -> bytes: ...

    def evicted_event(self, run_id: str, adapter: Adapter, events: int) -> bytes: ...


class LocalRun:
    """A run this process relays: its producer task, log, followers and checkpoints."""

    def __init__(
        self,
        runs: Host,
        run: Run,
        log: RunLog,
        *,
        credential: str | None,
        created: float | None = None,
        resume: Cause | None = None,
        epoch: int = 0,
    ) -> None:
        self.id = run.id
        self.run = run
        self.log = log
        self.credential = credential  # in memory only; checkpoints hold its keyed hash
        self.created = time.time() if created is None else created
        self.status: Status = "running"
        self.clients = 0
        self.last_write = 0.0
        self._runs = runs
        self._record_written = resume is not None  # a run taken over has its record
        self._flushed_seq = len(log.events) if resume is not None else 0
        self._watched = False
        self._deltas = 0
        self._grace: asyncio.TimerHandle | None = None
        self._stopped = False
        self.epoch = epoch  # this process's claim on the run: its writes carry it (fencing)
        self.lost = False  # another replica took the run over: nothing more is written here
        self.alias: str | None = None  # the answer's own id, where clients name it (Runs.alias)
        self.held = False  # no client reads it: its log counts against detached_memory
        self.evicted = False  # stopped for detached_memory: its followers are told so
        self._max_bytes = runs.config.max_run_bytes
        self._too_large = False
        self._keepalive: asyncio.TimerHandle | None = None
        # Checkpoints every ``checkpoint_every`` content deltas where another process
        # reads them. Only this process reads an in-memory store, and while the run
        # lives its followers read the log itself: the last checkpoint (``Runs.ended``)
        # is all a later resume needs.
        self._every = runs.config.checkpoint_every if runs.shared else 1 << 62
        self._progress = 0  # content received so far, in characters and tool calls
        self._gated = log.gated and runs.writer is not None
        self._alias = run.adapter.aliased  # until the answer's own id is known
        if runs.shared:  # another replica may take the run over from this checkpoint
            run.on_interrupted = self.checkpoint
        self.task = asyncio.get_running_loop().create_task(self._produce(resume))

    @property
    def durable_events(self) -> int:
        """Events the store has confirmed: a client may hold more (the crash window)."""
        return self._flushed_seq

    def owned_by(self, credential: str | None) -> bool:
        return hmac.compare_digest((self.credential or "").encode(), (credential or "").encode())

    def checkpoint(self) -> None:
        if self._runs.writer is not None and not self.lost:
            self._runs.writer.mark(self)

    async def _produce(self, resume: Cause | None) -> None:
        if self._runs.shared:
            # The first checkpoint (the record) goes with the first event: written
            # before it, it would compete with it for the loop (TTFT), and a client
            # with nothing yet has nothing to resume.
            self._deltas = self._every
        self._keep_alive(-1)
        try:
            await self.run.relay(self._emit, resume)
            self.status = self._ended_as() or "failed"
        except asyncio.CancelledError:
            # Stopped: its grace ran out, or the drain deadline (or it was cancelled while
            # closing its upstream after the last event: then it ended). Not re-raised:
            # this is the task's outermost frame, and a task that ends cancelled keeps
            # the error, whose traceback holds every frame of the run.
            self.status = self._ended_as() or "detached"
        finally:
            # Frees the run by reference counting: a run left in a cycle waits for the
            # collector, whose full passes pause every stream (BENCHMARKS.md).
            self.run.on_interrupted = None
            if self._keepalive is not None:
                self._keepalive.cancel()
                self._keepalive = None
            if self._grace is not None:  # its handle would keep the log for the grace
                self._grace.cancel()
                self._grace = None
            self.log.close()
            self._runs.ended(self)

    def _emit(self, data: bytes) -> Awaitable[None] | None:
        """One or more events of the run, as it relays them: into the log, and due for
        a checkpoint when they should be. Returns what to wait for when a follower is too
        far behind (the run stops reading its upstream meanwhile)."""
        log = self.log
        log.append(data)
        if self._alias and self.run.accumulator.identity is not None:
            self._alias = False
            self._runs.alias(self.run.accumulator.identity.get("id"), self)
        if self._gated:
            # Group commit: the writer's next batch carries this event, and its
            # acknowledgement releases it (``flushed``). With the store down for
            # longer than unprotected_after, events go out at once (counted).
            writer = self._runs.writer
            assert writer is not None
            if self.lost:
                pass  # fenced: what is not released is the new owner's to send
            elif writer.protecting:
                writer.mark(self)
            else:
                self._release_unprotected()
        accumulator = self.run.accumulator
        # Content only: the role chunk is not a delta.
        progress = accumulator.text_chars + accumulator.reasoning_chars
        progress += len(accumulator.tool_calls)
        if progress != self._progress:
            self._progress = progress
            self._deltas += 1
        if self._watched or self._deltas >= self._every:
            self._deltas = 0
            self.checkpoint()
        if log.size > self._max_bytes and not self._too_large:
            self._end_too_large()
        if self.held:
            self._runs.grew(self, len(data))
            if self.evicted:  # stopped for detached_memory: now, not after what is buffered
                raise asyncio.CancelledError
        limit = self._runs.max_client_lag
        if log.lagging(limit):
            # A follower is not reading: stop reading the upstream meanwhile.
            return self._make_room(limit)
        return None

    def _end_too_large(self) -> None:
        """The log passed max_run_bytes: raise into the relay, which ends the answer with
        the protocol's error and closes the upstream. Not once the answer is ending (its
        terminal events, or the error of another failure): those few bytes go out."""
        run = self.run
        if run.outcome is not None or run.splicer.finished:
            return
        self._too_large = True
        self._runs.metrics.runs_too_large.inc()
        limit = self._max_bytes
        raise RunTooLarge(
            f"The answer passed this gateway's limit for one run ({limit} bytes of events, "
            f"state.max_run_bytes) after {run.accumulator.text_chars} characters; it is "
            "incomplete."
        )

    async def _make_room(self, limit: int) -> None:
        """Wait for the followers; one that read nothing for the patience is left behind,
        and a run whose every follower is left behind is held as a detached one is."""
        await self.log.make_room(limit, self._runs.config.detach_grace)
        if self.log.unread:
            self._runs.hold(self)

    def _keep_alive(self, seen: int) -> None:
        """Every half ``keepalive_interval``: if no event came since the last look, ping
        the followers. So no client stream is silent much longer than the interval.

        One timer per run, not one per wait: the per-event path stays as it was.
        """
        events = len(self.log.events)
        if events == seen:
            self.log.ping()
        interval = self._runs.config.keepalive_interval / 2
        loop = asyncio.get_running_loop()
        self._keepalive = loop.call_later(interval, self._keep_alive, events)

    def _ended_as(self) -> Status | None:
        events, adapter = self.log.events, self.run.adapter
        if not events or not adapter.is_terminal(events[-1]):
            return None
        return "done" if adapter.succeeded(events[-1]) else "failed"

    # -- followers and the detach grace -------------------------------------------

    async def attach(self, after: int, *, ids: bool) -> AsyncIterator[bytes]:
        """The client body of one follower."""
        self.clients += 1
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self.held:
            self._runs.unhold(self)
        try:
            async for data in self.log.follow(after, ids=ids):
                yield data
            adapter, log = self.run.adapter, self.log
            # The client's next event number: what it was released (an answer whose last
            # events were never released here did not end for this client).
            events = log.visible
            if self.lost and (self.status == "detached" or log.visible < len(log.events)):
                yield self._runs.lost_event(self.id, adapter, events)
            elif self._stopped and self.status == "detached":
                yield self._runs.shutdown_event(self.id, adapter, events)
            elif self.evicted and self.status == "detached":
                yield self._runs.evicted_event(self.id, adapter, events)
        finally:
            self.clients -= 1
            if self.clients == 0:
                self._runs.hold(self)
                self.start_grace()

    def stop(self) -> None:
        """The drain deadline: end the run here, after a last checkpoint another
        replica can resume; its clients get an error event that says how."""
        self._stopped = True
        # On the next turn of the loop: a task cancelled before its first step never
        # runs its body, so it would neither close its log nor write its checkpoint.
        asyncio.get_running_loop().call_soon(self.task.cancel)

    def fenced(self) -> None:
        """Another replica claimed the run while this process was unresponsive past its
        lease (the store refused a write): end it here and write nothing more, the
        checkpoint is the new owner's; its clients get an error event that says how to
        resume, which finds the new owner."""
        self.lost = True
        self.run.background.moved = True  # its upstream response is the new owner's to read
        self.log.abandon()  # the new owner serves what this one never released
        if not self.task.done():
            asyncio.get_running_loop().call_soon(self.task.cancel)  # as in stop()

    def start_grace(self) -> None:
        """No client listens: cancel the run unless one attaches within the grace period."""
        if self.task.done() or self._grace is not None:
            return
        cancel: Callable[[], None] = self._expire
        self._grace = asyncio.get_running_loop().call_later(self._runs.config.detach_grace, cancel)

    def evict(self) -> None:
        """Over detached_memory: stop the run as its detach grace ending would (a last
        checkpoint, which a resume continues where the store keeps it)."""
        self.evicted = True
        if not self.task.done():
            asyncio.get_running_loop().call_soon(self.task.cancel)  # as in stop()

    def _expire(self) -> None:
        self._grace = None
        if self.clients == 0 and not self.task.done():
            self._runs.metrics.detached_cancelled.inc()
            self.task.cancel()

    # -- checkpoints (the writer's side) ------------------------------------------

    def flush(self, owner_key: bytes, *, rewrite: bool) -> Flush:
        config, run = self._runs.config, self.run
        events = self.log.events
        last = len(events)
        first = 1 if rewrite else self._flushed_seq + 1
        record = None
        if rewrite or not self._record_written:
            record = RunRecord(
                self.id,
                owner_hash(owner_key, self.credential),
                run.route.name,
                run.body,
                self.created,
                run.adapter.name,
                run.query,
                run.fallbacks,
                run.trace.traceparent if run.trace is not None else None,
            ).encode()
        accumulator, splicer = run.accumulator, run.splicer
        state = RunState(
            seq=last,
            status=self.status,
            leg=run.leg_index,
            splice_leg=splicer.leg,
            usage_by_leg={str(k): v for k, v in accumulator.usage_by_leg.items()},
            estimated_by_leg={str(k): v for k, v in accumulator.estimated_by_leg.items()},
            output_spent=accumulator.output_spent(),
            in_flight=[InFlightCall(name, args) for name, args in splicer.held_calls()],
            text_chars=accumulator.text_chars,
            reasoning_chars=accumulator.reasoning_chars,
            tool_calls=len(accumulator.tool_calls),
            cause=None if run.last_cause is None else run.last_cause.value,
            updated=time.time(),
            acked=self._flushed_seq,  # what a tail may give out (RunState.released)
            background=run.background_response(),
        )
        final = self.status != "running"
        return Flush(
            run_id=self.id,
            first_seq=first,
            events=b"".join(events[first - 1 : last]),
            last_seq=last,
            state=state.encode(),
            record=record,
            reset=rewrite,
            expire=record is not None or final or first == 1,
            ttl=config.completed_ttl if self.status in FINAL_STATUSES else config.ttl,
            lease=None if final else self._runs.replica,
            lease_ttl=config.lease_ttl,
            epoch=self.epoch,
        )

    def _release_unprotected(self) -> None:
        log = self.log
        count = len(log.events) - log.visible
        if count > 0:
            self._runs.metrics.unprotected_events.inc(count)
            log.release(len(log.events))

    def unflushed(self) -> None:
        """A write of this run failed: what its clients wait for goes out unprotected."""
        if not self.lost:
            self._release_unprotected()

    def flushed(self, flush: Flush, watched: bool) -> None:
        self._flushed_seq = flush.last_seq
        self.log.release(flush.last_seq)  # durability sync: its clients may have them now
        self._record_written = True
        self._watched = watched
        self.last_write = asyncio.get_running_loop().time()
        if flush.lease is None and self._runs.writer is not None:
            self._runs.writer.disown(self.id)
