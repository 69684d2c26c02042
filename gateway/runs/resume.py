"""Resuming any run from any replica, and the answers of finished runs.

A resume names a run and the number of events the client already has. Where the
run is, decides how the rest is served (``kind`` in ``gateway_resumes_total``):

- ``local``: this process relays it (live, detached, or just finished): the rest
  of its log, then the live events.
- ``replay``: it finished elsewhere: the rest of the stored log.
- ``tail``: another replica relays it (its lease is held): the stored log after
  the offset, then a blocking read of the same Redis Stream for live events, each
  given out once a replica acknowledged it (``RunState.acked``, said by the owner's
  next write). The tailer sets a ``watch`` key, and the owner checkpoints every event
  while it is set, so the tail lags the owner by one write, not by
  ``checkpoint_every`` deltas.
- ``takeover``: nobody holds its lease (its replica died, or it was stopped after
  its detach grace): this process claims the lease (SET NX: exactly one replica
  wins), rebuilds the run from the checkpoint, and continues the upstream with
  the recovery plan, as for a broken stream. The claim raises the run's epoch, so
  if the old owner was only paused, its writes are refused when it wakes up: it
  stops the run and tells its clients to resume (``run_moved``), which finds us.

A resume position is a number of events; it names content only where the log
holds those events. A client holding more than the store (events released while
Redis was down, writes a failover lost, the crash window of ``durability:
async``) cannot be placed: a new leg chunks and words its answer otherwise, so no
count of its events is the client's text. It gets ``resume_not_exact`` (409, or
an in-band error mid-tail), counted as ``outcome="not_exact"``, never a guess.

Ownership: only the credential that started a run resumes it. Locally the
credentials are compared; in the store, keyed hashes. Anything else is a 404
that says no more than an unknown id would.

Past 450 lines on purpose: the four kinds above are one decision over one
checkpoint (found, owned, placed), and each door (a resume, a HEAD, a replay)
reads it the same way (``_find``); split, they would each re-read the rules.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.checkpoint.model import Checkpoint, owner_hash
from gateway.checkpoint.store import CheckpointStore
from gateway.errors import GatewayError, NotFound, ResumeNotExact, ServiceUnavailable
from gateway.protocols import Adapter, adapter_named
from gateway.recovery.classify import Cause
from gateway.runs.durable import LocalRun
from gateway.runs.log import RunLog, render
from gateway.runs.registry import Runs
from gateway.runs.run import Run
from gateway.upstream.client import UpstreamClient
from gateway.upstream.routes import ResolvedRoute, Router

if TYPE_CHECKING:
    from gateway.tracing import Tracing

logger = logging.getLogger("gateway.resume")

TAIL_STORE_PATIENCE = 30.0  # seconds a tail asks a failing store again (a failover)
# Seconds a resume asks a failing store again before it answers 503: a Sentinel or
# Cluster failover (detection, vote, promotion) is over in a few seconds.
RESUME_STORE_PATIENCE = 10.0
STORE_RETRY = 0.2  # seconds between those asks
UNACKNOWLEDGED_WAIT = 0.02  # seconds a tail waits for the owner's next acknowledged write


class StoreFailed(Exception):
    """The store failed while a resume was placed: asked again, a while (``Resumes``)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Forwarding:
    """What a takeover sends upstream on behalf of the client that resumed the run, as
    its first request did: the upstream client's view with that client's forwardable
    headers (its ``x-api-key`` where the upstream has no key, ``anthropic-version``,
    ``anthropic-beta``, ``OpenAI-Organization``…), and the ``Authorization`` to pass.
    The client owns the run (its credential was checked), so these are the owner's."""

    upstreams: UpstreamClient
    authorization: str | None
    trace_context: Mapping[str, str] = field(default_factory=dict)  # traceparent, tracestate


class Placed(NamedTuple):
    """Where a resumed run was found, the rest of its stream, and its run span's
    ``traceparent`` (a resume's span links it)."""

    kind: str  # local, replay, takeover or tail: gateway_resumes_total's kind
    rest: AsyncIterator[bytes] | None
    run_trace: str | None


class RunNotFound(NotFound):
    code = "run_not_found"


def _not_exact(run_id: str, after: int, held: int) -> ResumeNotExact:
    return ResumeNotExact(
        f"Run {run_id!r} cannot be resumed exactly: the client has {after} events, and "
        f"the gateway holds only {held} (the rest were lost with a failed replica and "
        "its Redis). A continuation from there could repeat or drop text; request the "
        "answer again without x-run-id."
    )


def _store_down(run_id: str, exc: Exception) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"Run {run_id!r} cannot be resumed now: the checkpoint store is unavailable "
        f"({type(exc).__name__})."
    )


def _not_found(run_id: str) -> RunNotFound:
    return RunNotFound(
        f"No run {run_id!r} can be resumed with this credential: it is unknown, it "
        "expired, or another credential started it."
    )


class Resumes:
    """The resume doors' one way in: ``x-resume-from``, ``Last-Event-ID``,
    ``starting_after`` and ``GET /v1/responses/{id}`` all end here."""

    def __init__(self, runs: Runs, router: Router) -> None:
        self._runs = runs
        self._router = router
        self._metrics = runs.metrics
        self.tracing: Tracing | None = None  # resumes, and a takeover's run, are traced

    async def resume(
        self,
        run_id: str,
        credential: str | None,
        after: int,
        *,
        ids: bool,
        forwarding: Forwarding,
    ) -> AsyncIterator[bytes] | None:
        """The rest of a run's client stream after event ``after``; None if there is none.

        Raises ``RunNotFound`` for an unknown run or another credential, before
        anything is streamed.
        """
        trace = None
        if self.tracing is not None:
            trace = self.tracing.resume(
                run_id=run_id, after=after, headers=forwarding.trace_context
            )
        if trace is None:
            return (await self._patiently(run_id, credential, after, ids, forwarding)).rest
        # A takeover's run span is the resume span's child.
        forwarding = replace(forwarding, trace_context=trace.context)
        try:
            placed = await self._patiently(run_id, credential, after, ids, forwarding)
        except BaseException as exc:  # a refusal, the store down, a cancellation
            trace.refused(exc)
            raise
        trace.placed(placed.kind, placed.run_trace)
        return trace.follow(placed.rest)

    async def _patiently(
        self,
        run_id: str,
        credential: str | None,
        after: int,
        ids: bool,
        forwarding: Forwarding,
    ) -> Placed:
        """``_place``, asking a store that fails again for ``RESUME_STORE_PATIENCE``: a
        resume that meets a failover waits for the promoted primary rather than answering
        503, or a 404 or 409 read from a node that is no longer the primary. One claim
        for all the asks: one the store took but no replica acknowledged is this one's."""
        claim = f"{self._runs.replica}/{secrets.token_hex(4)}"  # this resume's (idempotent)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESUME_STORE_PATIENCE
        while True:
            try:
                return await self._place(run_id, credential, after, ids, forwarding, claim)
            except StoreFailed as failed:
                if loop.time() >= deadline:
                    raise self._store_failed(run_id, failed.cause) from None
            await asyncio.sleep(STORE_RETRY)

    async def check(self, run_id: str, credential: str | None) -> None:
        """Raise ``RunNotFound`` unless the run is known to this credential (counted as
        a refused resume), and do nothing else: a ``HEAD`` makes no claim, no tail and
        no follower."""
        try:
            await self._find(run_id, credential)
        except StoreFailed as failed:
            raise self._store_failed(run_id, failed.cause) from None

    async def _find(self, run_id: str, credential: str | None) -> LocalRun | Checkpoint:
        """The run as this process relays it, else its checkpoint; for its owner only."""
        local = self._runs.local.get(run_id)
        if local is not None:
            if not local.owned_by(credential):
                raise self._refused(run_id)
            return local
        if self._runs.store is None:
            raise self._refused(run_id)
        try:
            return await self._load(self._runs.store, run_id, credential)
        except GatewayError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store failed: asked again, a while
            raise StoreFailed(exc) from None

    async def _place(
        self,
        run_id: str,
        credential: str | None,
        after: int,
        ids: bool,
        forwarding: Forwarding,
        claim: str,
    ) -> Placed:
        found = await self._find(run_id, credential)
        if isinstance(found, LocalRun):
            events = len(found.log.events)
            if after > events:
                raise self._not_exact("local", run_id, after, events)
            self._count("local", "ok")
            traced = found.run.trace.traceparent if found.run.trace is not None else None
            if found.log.closed and after == events:
                return Placed("local", None, traced)
            return Placed("local", found.attach(after, ids=ids), traced)
        checkpoint, store = found, self._runs.store
        assert store is not None  # a checkpoint was found in it
        traced = checkpoint.record.trace
        if _finished(checkpoint):
            return Placed("replay", self._replay(checkpoint, run_id, after, ids), traced)
        try:
            if await store.lease_holder(run_id) is None:
                taken = await self._take_over(
                    store, run_id, credential, after, ids, forwarding, checkpoint, claim
                )
                if taken is not None:
                    return Placed("takeover", taken, traced)
        except GatewayError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store failed: asked again, a while
            raise StoreFailed(exc) from None
        self._count("tail", "ok")
        adapter = adapter_named(checkpoint.record.protocol)
        tail = self._tail(store, adapter, run_id, credential, after, ids, forwarding)
        return Placed("tail", tail, traced)

    def _store_failed(self, run_id: str, exc: Exception) -> ServiceUnavailable:
        self._count("store", "error")
        return _store_down(run_id, exc)

    def _route_of(self, checkpoint: Checkpoint) -> ResolvedRoute:
        """The legs that serve the run's protocol, as its first owner had them (with the
        request's own fallbacks): the checkpoint's leg is a position among those."""
        record = checkpoint.record
        protocol = adapter_named(record.protocol).name
        route = self._router.resolve(record.body.get("model"), protocol)
        if record.fallbacks is not None:
            route = route.with_fallbacks(
                [self._router.resolve(model, protocol).legs[0] for model in record.fallbacks]
            )
        return route.serving(protocol)

    def _refused(self, run_id: str) -> RunNotFound:
        self._count("none", "not_found")
        return _not_found(run_id)

    def _count(self, kind: str, outcome: str) -> None:
        self._metrics.resumes.labels(kind, outcome).inc()

    def _not_exact(self, kind: str, run_id: str, after: int, held: int) -> ResumeNotExact:
        self._count(kind, "not_exact")
        logger.warning(
            "resume not exact: the client holds events the store lost",
            extra={"run_id": run_id, "client_has": after, "events": held},
        )
        return _not_exact(run_id, after, held)

    def _placed(self, checkpoint: Checkpoint, run_id: str, after: int) -> None:
        """Raise ``ResumeNotExact`` unless the stored log holds the client's ``after`` events."""
        if after > len(checkpoint.events):
            raise self._not_exact("takeover", run_id, after, len(checkpoint.events))

    async def _load(
        self, store: CheckpointStore, run_id: str, credential: str | None
    ) -> Checkpoint:
        checkpoint = await store.load(run_id)
        if checkpoint is None:
            raise self._refused(run_id)
        writer = self._runs.writer
        assert writer is not None
        expected = owner_hash(await writer.owner_key(), credential)
        if not secrets.compare_digest(expected, checkpoint.record.owner):
            raise self._refused(run_id)
        return checkpoint

    def _replay(
        self, checkpoint: Checkpoint, run_id: str, after: int, ids: bool
    ) -> AsyncIterator[bytes] | None:
        """The rest of a finished run's stored log; None if the client has it all."""
        events = checkpoint.events
        if after > len(events):
            raise self._not_exact("replay", run_id, after, len(events))
        self._count("replay", "ok")
        return _rest(events, after, ids) if after < len(events) else None

    async def _take_over(
        self,
        store: CheckpointStore,
        run_id: str,
        credential: str | None,
        after: int,
        ids: bool,
        forwarding: Forwarding,
        checkpoint: Checkpoint | None = None,
        claim: str | None = None,
    ) -> AsyncIterator[bytes] | None:
        """Claim a run nobody holds and continue it here; None if another replica won.

        ``checkpoint``: the run as just loaded, if it was. A client it cannot place
        is refused before the claim, so the run stays free for one it can. ``claim``:
        this resume's, the same when it asks again (the claim is idempotent).
        """
        if checkpoint is None:
            checkpoint = await self._load(store, run_id, credential)
        self._placed(checkpoint, run_id, after)
        # Its route first: a fallback this replica cannot resolve fails before any claim.
        route = self._route_of(checkpoint)
        claim = claim or f"{self._runs.replica}/{secrets.token_hex(4)}"  # idempotent
        epoch = await store.claim(run_id, claim, self._runs.config.lease_ttl)
        if epoch is None:
            await self._load(store, run_id, credential)  # RunNotFound if it is gone meanwhile
            return None
        # Read again under the lease: the last owner may have written since (or, after
        # a failover, the store may hold less: then the client is refused, and the
        # lease left to expire).
        checkpoint = await self._load(store, run_id, credential)
        record, state = checkpoint.record, checkpoint.state
        if _finished(checkpoint):
            return self._replay(checkpoint, run_id, after, ids) or _nothing()
        self._placed(checkpoint, run_id, after)
        adapter = adapter_named(record.protocol)
        run = Run(
            run_id=run_id,
            adapter=adapter,
            route=route,
            body=record.body,
            client_authorization=forwarding.authorization,
            upstreams=forwarding.upstreams,
            metrics=self._metrics,
            query=record.query,
            fallbacks=record.fallbacks,
        )
        accumulator = adapter.replay(checkpoint.events)
        for leg, usage in state.usage_by_leg.items():
            accumulator.set_usage(int(leg), usage)
        accumulator.restore_estimates({int(k): v for k, v in state.estimated_by_leg.items()})
        accumulator.restore_spent(state.output_spent)
        run.restore(
            accumulator,
            leg=state.leg,
            splice_leg=state.splice_leg,
            in_flight=[call.name or "unnamed tool" for call in state.in_flight],
            background=state.background,
            events=checkpoint.events,
        )
        cause = Cause.DETACHED if state.status == "detached" else Cause.REPLICA_LOST
        logger.info(
            "takeover",
            extra={
                "run_id": run_id,
                "cause": cause.value,
                "events": len(checkpoint.events),
                "sent_chars": state.text_chars,
                "client_has": after,
            },
        )
        if self.tracing is not None:  # once the run is rebuilt: its span always ends
            run.trace = self.tracing.run(
                protocol=adapter.name,
                model=record.body.get("model"),
                route=route.name,
                run_id=run_id,
                stream=run.stream,
                provider=route.legs[0].upstream.kind,
                headers=forwarding.trace_context,
                continues=record.trace or "",
            )
        local = self._runs.adopt(
            run,
            credential,
            RunLog(
                adapter,
                checkpoint.events,
                gated=self._runs.shared and self._runs.config.durability == "sync",
            ),
            created=record.created,
            resume=cause,
            epoch=epoch,
        )
        self._count("takeover", "ok")
        return local.attach(after, ids=ids)

    async def _tail(
        self,
        store: CheckpointStore,
        adapter: Adapter,
        run_id: str,
        credential: str | None,
        after: int,
        ids: bool,
        forwarding: Forwarding,
    ) -> AsyncIterator[bytes]:
        """Follow a run another replica relays; take it over if that replica dies.

        A store that fails meanwhile (a failover) is asked again for up to
        ``TAIL_STORE_PATIENCE`` seconds: the tail goes on from its position, exactly.
        Then the stream ends with an error that says so.
        """
        with self._runs.in_progress():  # a tail is a stream the drain lets finish
            seq, block = after, min(1.0, self._runs.config.lease_ttl / 2)
            loop = asyncio.get_running_loop()
            watched_until = 0.0
            failing_since: float | None = None
            while True:
                if self._runs.stopping:
                    yield self._runs.shutdown_event(run_id, adapter, seq)
                    return
                try:
                    if loop.time() >= watched_until:
                        await store.watch(run_id, 4 * block)
                        watched_until = loop.time() + block
                    entries = await store.read_events(run_id, seq, block)
                    unreleased = False
                    if entries:
                        # Only what a replica acknowledged: an event the store has that
                        # a failover could still lose is not given out yet (it would put
                        # this client ahead of the run that goes on from the store).
                        released = await store.released(run_id)
                        if released is not None and entries[-1][0] > released:
                            entries = [e for e in entries if e[0] <= released]
                            unreleased = True
                    held = bool(entries) or await store.lease_holder(run_id) is not None
                    taken = None
                    if not held:
                        taken = await self._take_over(
                            store, run_id, credential, seq, ids, forwarding
                        )
                    elif unreleased and not entries:
                        await asyncio.sleep(UNACKNOWLEDGED_WAIT)  # the owner's next write
                        continue
                except GatewayError as exc:  # gone meanwhile (e.g. completed_ttl 0)
                    yield adapter.error_event(exc, seq)
                    return
                except Exception as exc:  # noqa: BLE001 - the store fails: ask again, a while
                    now = loop.time()
                    failing_since = now if failing_since is None else failing_since
                    if now - failing_since >= TAIL_STORE_PATIENCE:
                        self._count("tail", "error")
                        yield adapter.error_event(_store_down(run_id, exc), seq)
                        return
                    await asyncio.sleep(STORE_RETRY)
                    continue
                failing_since = None
                if entries:
                    yield render(entries, ids=ids)
                    seq = entries[-1][0]
                    if adapter.is_terminal(entries[-1][1]):
                        return
                elif taken is not None:
                    async for data in taken:
                        yield data
                    return

    async def answer_of(
        self, run_id: str, credential: str | None
    ) -> tuple[dict[str, Any], list[bytes] | dict[str, Any]] | None:
        """The request and client events (or, not streamed, the answer) of a finished
        run, for its owner only; None if not finished or gone. Raises ``RunNotFound``
        for another credential."""
        assembled = self._runs.aliases.assembled_answer(run_id)
        if assembled is not None:
            owner, body, answer = assembled
            if not secrets.compare_digest((owner or "").encode(), (credential or "").encode()):
                raise self._refused(run_id)
            return body, answer
        local = self._runs.local.get(run_id)
        if local is not None:
            if not local.owned_by(credential):
                raise self._refused(run_id)
            return (local.run.body, list(local.log.events)) if local.log.closed else None
        if self._runs.store is None:
            return None
        try:
            checkpoint = await self._load(self._runs.store, run_id, credential)
        except RunNotFound:
            return None  # expired: the caller says what that means
        if not _finished(checkpoint):
            return None
        return checkpoint.record.body, checkpoint.events


async def _rest(events: list[bytes], after: int, ids: bool) -> AsyncIterator[bytes]:
    yield render(enumerate(events[after:], after + 1), ids=ids)


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


def _finished(checkpoint: Checkpoint) -> bool:
    """Whether the stored log ends the answer (its last event is terminal)."""
    events = checkpoint.events
    return bool(events) and adapter_named(checkpoint.record.protocol).is_terminal(events[-1])
