"""The Redis store on every topology it supports, with real processes dying under it.

- Standalone: a Redis restarted under a full connection pool. The first command on
  each stale pooled connection is sent again on a fresh one (redis-py's retry, see
  ``gateway.checkpoint.redis``), so no caller sees the restart.
- Cluster (3 primaries, 3 replicas): the primary holding a run's slot is killed
  mid-way. Runs on the other primaries go on being written (a batch's runs fail
  one by one, ``Applied.FAILED``, not all together); the run's writes fail until
  its replica took over, then succeed, and it is rewritten whole; readiness is
  503 from the kill until the failover, 200 after.
- Sentinel (a primary, a replica, 3 sentinels): the primary is killed; the same,
  with every run failing until the sentinels promoted the replica.

Redis replicates asynchronously: a write acknowledged by a primary just before it
dies may not have reached the replica that replaces it. The *witness* runs measure
it (their last write is acknowledged just before the kill, never written again):
the tests require that what survives is whole (a prefix that ends at a write) and
report the numbers in the test's ``record_property`` and output, without failing on
a loss, which Redis allows. On loopback a healthy replica loses nothing; the
``lagging`` cases freeze the replica and cut its link 0.3 s before the kill, so the
primary's last acknowledged writes are certainly lost: the witnesses show it, and
the writer's runs, rewritten whole after the failover, must come out complete anyway
(written from where they were, they would have a hole where the lost writes were).

The writer's runs here are stand-ins (``Run``) that checkpoint as
``gateway.runs.durable.LocalRun`` does: after the first write, only what is new, unless
the writer asks for a rewrite. Each test needs ``redis-server`` (and ``redis-cli``
for the Cluster) and takes under 15 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from gateway.checkpoint.model import Applied, Flush, RunRecord, RunState, Status
from gateway.checkpoint.redis import RedisStore
from gateway.checkpoint.writer import CheckpointWriter
from gateway.metrics import Metrics
from tests.redis_cluster import RedisClusterNodes, port_of, running_cluster
from tests.redis_server import RedisServer, local_redis, role, running_sentinels

needs_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs redis-server (scripts/install)"
)
needs_cluster = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="needs redis-server and redis-cli (scripts/install)",
)

LEASE = 60.0  # long: no heartbeat writes in these tests but the ones they make
PROBE_TIMEOUT = 0.5  # as gateway.context.STORE_CHECK_TIMEOUT


def event(run_id: str, seq: int) -> bytes:
    return f'data: {{"run": "{run_id}", "seq": {seq}}}\n\n'.encode()


class Run:
    """A run as the writer sees it (``writer.Checkpointed``), checkpointed as
    ``LocalRun`` does: its record once, then only the events not written yet."""

    def __init__(self, run_id: str) -> None:
        self.id = run_id
        self.last_write = 0.0
        self.events: list[bytes] = []
        self.flushed_seq = 0  # events acknowledged by the store
        self.record_written = False
        self.done = False
        self.unflushed_count = 0
        self.fenced_count = 0
        self.rewrites: list[bool] = []  # the writer's ``rewrite`` for each flush

    def add(self, count: int = 1) -> None:
        for _ in range(count):
            self.events.append(event(self.id, len(self.events) + 1))

    def flush(self, owner_key: bytes, *, rewrite: bool) -> Flush:
        self.rewrites.append(rewrite)
        last = len(self.events)
        first = 1 if rewrite else self.flushed_seq + 1
        record = None
        if rewrite or not self.record_written:
            record = RunRecord(self.id, "owner", "*", {"model": "m"}, 0.0).encode()
        status: Status = "done" if self.done else "running"
        state = RunState(seq=last, status=status, leg=0, splice_leg=0).encode()
        return Flush(
            self.id,
            first,
            b"".join(self.events[first - 1 : last]),
            last,
            state,
            record,
            reset=rewrite,
            expire=record is not None or self.done or first == 1,
            ttl=600,
            lease=None if self.done else "replica-a",
            lease_ttl=LEASE,
        )

    def flushed(self, flush: Flush, watched: bool) -> None:
        self.flushed_seq = flush.last_seq
        self.record_written = True
        self.last_write = asyncio.get_running_loop().time()

    def unflushed(self) -> None:
        self.unflushed_count += 1

    def fenced(self) -> None:
        self.fenced_count += 1


def writes(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("gateway_checkpoint_writes_total", {"result": result})
    return value or 0.0


# -- the writer, on a store that fails one run of a batch (no Redis) ----------------------


class OneRunDown:
    """A store whose part holding ``down`` is unreachable: its flushes are FAILED."""

    shared = True

    def __init__(self, down: str) -> None:
        self.down: str | None = down
        self.batches: list[list[Flush]] = []

    async def owner_key(self) -> bytes:
        return b"key"

    async def write(self, flushes: Sequence[Flush]) -> list[Applied]:
        self.batches.append(list(flushes))
        return [Applied.FAILED if f.run_id == self.down else Applied.WRITTEN for f in flushes]


def test_a_run_whose_write_failed_alone_is_retried_and_rewritten_while_the_others_are_written() -> (
    None
):
    metrics = Metrics()
    store = OneRunDown(down="b")
    runs = {name: Run(name) for name in "abc"}

    async def go() -> None:
        writer = CheckpointWriter(store, metrics, lease_ttl=LEASE)  # type: ignore[arg-type]
        for run in runs.values():
            run.add(3)
            writer.mark(run)
        assert await writer.write_due()  # the store answered: no backoff for a, c
        a, b, c = runs["a"], runs["b"], runs["c"]
        assert (a.flushed_seq, b.flushed_seq, c.flushed_seq) == (3, 0, 3)
        assert (a.unflushed_count, b.unflushed_count, c.unflushed_count) == (0, 1, 0)
        assert writes(metrics, "ok") == 2 and writes(metrics, "error") == 1
        assert writer.healthy  # the store as a whole is up
        # b is due again, with nothing new; a alone has something new.
        a.add()
        writer.mark(a)
        assert await writer.write_due()
        assert sorted(f.run_id for f in store.batches[-1]) == ["a", "b"]
        assert writes(metrics, "error") == 2 and b.unflushed_count == 2
        # b's part is back: b is written whole (its primary may have lost, or applied,
        # its last writes); a, written fine all along, only what is new.
        store.down = None
        a.add()
        writer.mark(a)
        assert await writer.write_due()
        flushes = {f.run_id: f for f in store.batches[-1]}
        assert flushes["b"].reset and flushes["b"].first_seq == 1
        assert flushes["b"].record is not None
        assert not flushes["a"].reset and flushes["a"].first_seq == 5
        assert (a.flushed_seq, b.flushed_seq) == (5, 3)
        # Written once whole, b is written as the others again: only what is new.
        b.add()
        writer.mark(b)
        assert await writer.write_due()
        [again] = store.batches[-1]
        assert again.run_id == "b" and not again.reset and again.first_seq == 4
        assert writes(metrics, "error") == 2 and writes(metrics, "ok") == 6

    asyncio.run(go())


# -- standalone: a restart under a full pool ---------------------------------------------

POOL = 8


@needs_redis
@pytest.mark.parametrize("command", ["load", "read_events", "write", "ping"])
def test_the_first_command_after_a_redis_restart_succeeds_on_stale_pooled_connections(
    command: str,
) -> None:
    def clients(url: str) -> int:
        client = redis.Redis.from_url(url)
        try:
            return len(client.client_list()) - 1
        finally:
            client.close()

    with local_redis() as server:

        async def go() -> None:
            store = RedisStore(server.url, pool_size=POOL)
            try:
                # Every pooled connection opened, and idle (blocking reads hold one each).
                await asyncio.gather(*(store.read_events("x", 0, block=0.2) for _ in range(POOL)))
                await store.ping()
                assert await asyncio.to_thread(clients, server.url) == POOL + 1  # + the probe
                await asyncio.to_thread(server.stop)  # SIGKILL
                await asyncio.to_thread(server.restart)  # same port, empty
                calls: dict[str, Callable[[int], Awaitable[Any]]] = {
                    "load": lambda i: store.load(f"run-{i}"),
                    "read_events": lambda i: store.read_events(f"run-{i}", 0),
                    "write": lambda i: store.write([Run(f"run-{i}").flush(b"k", rewrite=True)]),
                    "ping": lambda i: store.ping(),
                }
                count = 1 if command == "ping" else POOL
                results = await asyncio.gather(
                    *(calls[command](i) for i in range(count)), return_exceptions=True
                )
                failures = [r for r in results if isinstance(r, BaseException)]
                assert not failures, f"{len(failures)} of {len(results)} failed: {failures[0]!r}"
            finally:
                await store.aclose()

        asyncio.run(go())


# -- failovers ---------------------------------------------------------------------------


@dataclass
class Timeline:
    """Seconds from the kill to each event (None: never seen)."""

    ready_lost: float | None = None  # the first failed readiness check
    failover: float | None = None  # the topology names the new primary
    ready_back: float | None = None  # the first passing check after a failed one
    victims_written: float | None = None  # every victim run written again

    def report(self) -> str:
        def at(value: float | None) -> str:
            return "never" if value is None else f"{value:.2f} s"

        return (
            f"readiness lost {at(self.ready_lost)}, failover {at(self.failover)}, "
            f"readiness back {at(self.ready_back)}, victims written {at(self.victims_written)}"
        )


async def probe_readiness(
    store: RedisStore, timeline: Timeline, killed: float, stop: asyncio.Event
) -> None:
    """Check the store as /readyz does (bounded), every 50 ms, until ``stop``.

    Stopped by an event, not cancelled: on Python 3.11, a cancellation that lands
    just as redis-py's ``asyncio.wait_for`` around a socket write completes is lost.
    """
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await store.ping()
            ok = True
        except Exception:  # noqa: BLE001 - any failure is not ready, as in gateway.context
            ok = False
        now = loop.time() - killed
        if not ok and timeline.ready_lost is None:
            timeline.ready_lost = now
        if ok and timeline.ready_lost is not None and timeline.ready_back is None:
            timeline.ready_back = now
        await asyncio.sleep(0.05)


async def produce(writer: CheckpointWriter, runs: Sequence[Run], stop: asyncio.Event) -> None:
    """Each run gets an event and is marked due every 20 ms, as streaming runs do."""
    while not stop.is_set():
        for run in runs:
            run.add()
            writer.mark(run)
        await asyncio.sleep(0.02)


async def wait_for_promotion(replica: RedisServer, killed: float, within: float) -> float:
    """Seconds from the kill until ``replica`` is a primary (the first node to know)."""
    loop = asyncio.get_running_loop()
    while await asyncio.to_thread(role, replica) != "master":
        assert loop.time() - killed < within, f"no failover within {within} s"
        await asyncio.sleep(0.05)
    return loop.time() - killed


async def wait_until(predicate: Callable[[], bool], within: float, message: str) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, message
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def opened(url: str, **settings: Any) -> AsyncIterator[RedisStore]:
    """The store at ``url`` (``RedisStore``'s ``settings``), closed on exit."""
    store = RedisStore(url, **settings)
    try:
        yield store
    finally:
        await store.aclose()


async def kill_primary(
    store: RedisStore,
    primary: RedisServer,
    replica: RedisServer,
    witnesses: Sequence[Run],
    *,
    lagging: bool,
) -> None:
    """SIGKILL ``primary`` right after the witnesses' last writes were acknowledged.

    Each witness: events 1-5 written and given time to replicate, then 6-10. With
    ``lagging``, the replica stopped receiving (frozen, its link cut by the primary)
    0.3 s before the kill: what the primary acknowledged since never reached it.
    """
    for run in witnesses:
        run.add(5)
    assert set(await store.write([w.flush(b"k", rewrite=False) for w in witnesses])) == {
        Applied.WRITTEN
    }
    for run in witnesses:
        run.flushed_seq, run.record_written = 5, True
    await asyncio.sleep(0.3)
    process = replica.process
    assert process is not None
    if lagging:
        process.send_signal(signal.SIGSTOP)
        await asyncio.to_thread(cut_replication_links, primary)
        await asyncio.sleep(0.3)  # the writer's runs: written to the primary alone
    try:
        for run in witnesses:
            run.add(5)
        assert set(await store.write([w.flush(b"k", rewrite=False) for w in witnesses])) == {
            Applied.WRITTEN
        }
        await asyncio.to_thread(primary.stop)  # SIGKILL, right after the ack
    finally:
        if lagging:
            process.send_signal(signal.SIGCONT)


def cut_replication_links(primary: RedisServer) -> None:
    client = redis.Redis.from_url(primary.url, socket_timeout=1)
    try:
        assert client.client_kill_filter(_type="replica")
    finally:
        client.close()


async def check_runs(store: RedisStore, runs: Sequence[Run]) -> None:
    """Each run is stored whole: its record, its state at its last event, every event once."""
    for run in runs:
        checkpoint = await store.load(run.id)
        assert checkpoint is not None, run.id
        assert checkpoint.record.run_id == run.id
        assert checkpoint.state.seq == len(run.events) and checkpoint.state.status == "done"
        assert checkpoint.events == run.events, f"{run.id}: events differ from what was written"


async def surviving_witness_events(store: RedisStore, witnesses: Sequence[Run]) -> list[int]:
    """Per witness, how many of its 10 acknowledged events the new primary has. What is
    there must be whole: the first write (5 events) or both (10), state to match."""
    kept = []
    for run in witnesses:
        checkpoint = await store.load(run.id)
        assert checkpoint is not None, f"{run.id}: its first write was lost too"
        count = len(checkpoint.events)
        assert count in (5, 10) and checkpoint.events == run.events[:count], run.id
        assert checkpoint.state.seq == count, f"{run.id}: state and events disagree"
        kept.append(count)
    return kept


def finish(writer: CheckpointWriter, runs: Sequence[Run]) -> None:
    for run in runs:
        run.done = True
        writer.mark(run)


def check_timeline(timeline: Timeline) -> None:
    """Not ready within a second of the kill, until the failover; ready soon after."""
    lost, failover, back = timeline.ready_lost, timeline.failover, timeline.ready_back
    assert lost is not None and lost < 1.0, timeline.report()
    assert failover is not None and back is not None, timeline.report()
    # A check can only pass once the replica took over (0.1 s: how late this test
    # sees the promotion it polls for); then it passes within a couple of checks.
    assert failover - 0.1 < back < failover + 2.0, timeline.report()


@contextlib.asynccontextmanager
async def writing(store: RedisStore, metrics: Metrics, runs: Sequence[Run]) -> AsyncIterator[None]:
    """A writer checkpointing ``runs`` while their events keep coming, from their first
    writes on; on exit the events stop, the runs finish, and each must be written whole."""
    writer = CheckpointWriter(store, metrics, lease_ttl=LEASE)
    writer.start()
    stop = asyncio.Event()
    producing = asyncio.get_running_loop().create_task(produce(writer, runs, stop))
    await wait_until(lambda: all(run.flushed_seq >= 10 for run in runs), 5, "no first writes")
    yield
    stop.set()
    await producing
    finish(writer, runs)
    await wait_until(lambda: not writer._due, 5, "last writes not done")
    await writer.aclose()
    assert all(run.flushed_seq == len(run.events) for run in runs)


@contextlib.asynccontextmanager
async def probing(store: RedisStore, timeline: Timeline, killed: float) -> AsyncIterator[None]:
    """``store`` checked as /readyz does (``probe_readiness``) into ``timeline``; on exit,
    once a check passed again."""
    probed = asyncio.Event()
    task = asyncio.get_running_loop().create_task(probe_readiness(store, timeline, killed, probed))
    yield
    await wait_until(lambda: timeline.ready_back is not None, 5, "never ready again")
    probed.set()
    await task


def failover_report(
    topology: str, lagging: bool, timeline: Timeline, kept: Sequence[int], metrics: Metrics
) -> str:
    """What a failover test records: its timeline, and the witness events it lost."""
    lost = sum(10 - count for count in kept)
    return (
        f"{topology} ({'lagging replica' if lagging else 'default'}): "
        f"{timeline.report()}; acknowledged witness events lost on "
        f"failover: {lost} of {10 * len(kept)} "
        f"({sum(count < 10 for count in kept)} of {len(kept)} witness runs); "
        f"checkpoint writes ok {writes(metrics, 'ok'):.0f}, "
        f"failed {writes(metrics, 'error'):.0f}"
    )


# -- Cluster -----------------------------------------------------------------------------


def ids_by_primary(
    cluster: RedisClusterNodes, per_primary: int, prefix: str
) -> dict[int, list[str]]:
    """Run ids whose slots are on each primary (by port): ``per_primary`` each."""
    ranges = cluster.slots()
    out: dict[int, list[str]] = {port: [] for _, _, port, _ in ranges}
    i = 0
    while any(len(ids) < per_primary for ids in out.values()):
        run_id = f"{prefix}-{i}"
        slot = key_slot(run_id.encode())
        port = next(p for first, last, p, _ in ranges if first <= slot <= last)
        if len(out[port]) < per_primary:
            out[port].append(run_id)
        i += 1
    return out


@needs_cluster
@pytest.mark.parametrize(
    "lagging",
    [
        pytest.param(False, id="default"),
        # cluster-require-full-coverage no: the other primaries never refuse (no
        # CLUSTERDOWN), so the dead primary's runs alone fail, and are repaired alone.
        pytest.param(True, id="lagging-replica-partial-coverage"),
    ],
)
def test_cluster_primary_killed_mid_run_fails_over_and_the_other_runs_go_on(
    lagging: bool, record_property: Callable[[str, object], None]
) -> None:
    with running_cluster(replicas=1, node_timeout=1000, full_coverage=not lagging) as cluster:
        ids = ids_by_primary(cluster, per_primary=3, prefix="run")
        probe_ids = ids_by_primary(cluster, per_primary=1, prefix="probe")
        witness_ids = ids_by_primary(cluster, per_primary=10, prefix="witness")
        victim_port = port_of(cluster.primary_of(ids[min(ids)][0]))
        victim_node = cluster.node(victim_port)
        replica = cluster.replica_of(victim_node)
        runs = [Run(run_id) for port in sorted(ids) for run_id in ids[port]]
        victims = [run for run in runs if run.id in ids[victim_port]]
        others = [run for run in runs if run not in victims]
        witnesses = [Run(run_id) for run_id in witness_ids[victim_port]]
        metrics = Metrics()
        timeline = Timeline()

        async def go() -> None:
            loop = asyncio.get_running_loop()
            async with opened(cluster.url) as store, writing(store, metrics, runs):
                await store.ping()  # ready (a gateway's readiness is polled from its start)
                await kill_primary(store, victim_node, replica, witnesses, lagging=lagging)
                killed = loop.time()
                at_kill = {run.id: run.flushed_seq for run in runs}
                async with probing(store, timeline, killed):
                    # At once, before the cluster even notices: one batch, one run per
                    # primary. The dead primary's run fails, alone; the others are written.
                    probes = {port: Run(run_ids[0]) for port, run_ids in probe_ids.items()}
                    for run in probes.values():
                        run.add(2)
                    ports = sorted(probes)
                    applied = await store.write(
                        [probes[p].flush(b"k", rewrite=True) for p in ports]
                    )
                    assert applied == [
                        Applied.FAILED if p == victim_port else Applied.WRITTEN for p in ports
                    ]
                    # A batch of nothing but the dead primary's runs is the store down: it
                    # raises, as standalone Redis does (the writer backs off).
                    with pytest.raises(redis.RedisError):
                        await store.write([probes[victim_port].flush(b"k", rewrite=True)])

                    # The replica takes the slots over.
                    timeline.failover = await wait_for_promotion(replica, killed, within=15)
                    # The other primaries' runs were written during the outage.
                    during = {run.id: run.flushed_seq - at_kill[run.id] for run in others}
                    assert all(during.values()), during
                    if lagging:  # and never failed: only Redis's CLUSTERDOWN fails them
                        assert not any(run.unflushed_count for run in others)
                    await wait_until(
                        lambda: all(run.flushed_seq > at_kill[run.id] for run in victims),
                        10,
                        "the dead primary's runs were never written again",
                    )
                    timeline.victims_written = loop.time() - killed
                    assert all(any(run.rewrites[1:]) for run in victims)  # rewritten whole
            # A client that saw none of it (through a node alive: the URL names the dead one).
            async with opened(f"redis+cluster://127.0.0.1:{port_of(replica)}") as fresh:
                await check_runs(fresh, runs)
                kept = await surviving_witness_events(fresh, witnesses)
            report = (
                f"{failover_report('cluster', lagging, timeline, kept, metrics)}; events "
                f"checkpointed during the outage for the other primaries' runs: "
                f"{sorted(during.values())}, "
                f"their failed writes: {sum(run.unflushed_count for run in others)}"
            )
            print(report)
            record_property("failover", report)

        asyncio.run(go())
        check_timeline(timeline)


# -- Sentinel ----------------------------------------------------------------------------


@needs_redis
@pytest.mark.parametrize("lagging", [False, True], ids=["default", "lagging-replica"])
def test_sentinel_primary_killed_mid_run_fails_over_and_the_writer_recovers(
    lagging: bool, record_property: Callable[[str, object], None]
) -> None:
    with running_sentinels(down_after_ms=1000, failover_timeout_ms=3000) as sentinels:
        runs = [Run(f"run-{i}") for i in range(6)]
        witnesses = [Run(f"witness-{i}") for i in range(10)]
        metrics = Metrics()
        timeline = Timeline()
        old, replica = sentinels.servers  # the primary as started, its replica
        assert sentinels.primary() is old

        async def go() -> None:
            loop = asyncio.get_running_loop()
            async with opened(sentinels.url) as store, writing(store, metrics, runs):
                await store.ping()  # ready (a gateway's readiness is polled from its start)
                await kill_primary(store, old, replica, witnesses, lagging=lagging)
                killed = loop.time()
                at_kill = {run.id: run.flushed_seq for run in runs}
                async with probing(store, timeline, killed):
                    timeline.failover = await wait_for_promotion(replica, killed, within=15)
                    await wait_until(
                        lambda: all(run.flushed_seq > at_kill[run.id] for run in runs),
                        10,
                        "the runs were never written again",
                    )
                    timeline.victims_written = loop.time() - killed
                    assert all(any(run.rewrites[1:]) for run in runs)  # rewritten whole
            async with opened(sentinels.url) as fresh:
                await check_runs(fresh, runs)
                kept = await surviving_witness_events(fresh, witnesses)
            report = failover_report("sentinel", lagging, timeline, kept, metrics)
            print(report)
            record_property("failover", report)

        asyncio.run(go())
        check_timeline(timeline)
