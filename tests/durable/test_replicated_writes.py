"""Checkpoints acknowledged by a replica too (``state.wait_replicas``, Redis WAIT), and
events held through a store failure for ``unprotected_after``.

Real Redis processes: a primary with a replica (the Sentinel fixture's two servers,
addressed directly), a primary alone, and a Cluster with a replica per primary. A
replica frozen with SIGSTOP stops acknowledging, as a lagging one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
import redis
from redis.exceptions import ConnectionError

from gateway.checkpoint.model import Applied, Flush
from gateway.checkpoint.redis import RedisStore
from gateway.checkpoint.replication import PROBE_WAIT
from gateway.checkpoint.writer import CheckpointWriter
from gateway.metrics import Metrics
from tests.durable.test_redis_topologies import Run, needs_cluster, needs_redis, opened, writes
from tests.redis_cluster import running_cluster
from tests.redis_server import RedisServer, frozen, local_redis, running_sentinels

WAIT = 0.5


def waiting(url: str) -> contextlib.AbstractAsyncContextManager[RedisStore]:
    """The store at ``url``, whose writes wait (``WAIT`` at most) for a replica's
    acknowledgement, closed on exit."""
    return opened(url, wait_replicas=None, wait_timeout=WAIT)


def waits(server: RedisServer) -> int:
    """WAIT commands ``server`` has run."""
    client = redis.Redis.from_url(server.url)
    try:
        stats: Any = client.info("commandstats")
    finally:
        client.close()
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def stored(server: RedisServer, run: Run) -> int:
    """The seq of ``run``'s state as ``server`` holds it (0: none)."""
    client = redis.Redis.from_url(server.url)
    try:
        raw = client.get(f"rg:{{{run.id}}}:state")
    finally:
        client.close()
    return 0 if raw is None else int(orjson.loads(raw)["seq"])


async def write(store: RedisStore, runs: Sequence[Run]) -> tuple[list[Applied], float]:
    for run in runs:
        run.add()
    started = time.perf_counter()
    applied = await store.write([run.flush(b"key", rewrite=False) for run in runs])
    for run, result in zip(runs, applied, strict=True):
        if result not in (Applied.FAILED, Applied.FENCED):
            run.flushed_seq = len(run.events)
            run.record_written = True
    return applied, time.perf_counter() - started


@needs_redis
def test_a_write_is_acknowledged_by_the_replica_and_a_frozen_replica_costs_one_wait() -> None:
    with running_sentinels() as topology:
        primary, replica = topology.servers
        run = Run("r1")

        async def go() -> None:
            async with waiting(primary.url) as store:
                applied, _ = await write(store, [run])
                assert applied == [Applied.WRITTEN]
                # WAIT returned: the replica has it, the moment the write returns.
                assert stored(replica, run) == 1
                with frozen(replica):
                    applied, took = await write(store, [run])
                    assert applied == [Applied.UNREPLICATED] and took >= WAIT * 0.9
                    # Behind: the next writes only probe it, briefly.
                    applied, took = await write(store, [run])
                    assert applied == [Applied.UNREPLICATED] and took < WAIT / 2
                deadline = time.monotonic() + 5
                while (await write(store, [run]))[0] != [Applied.WRITTEN]:
                    assert time.monotonic() < deadline, "the replica never caught up"
                assert stored(replica, run) == len(run.events)

        asyncio.run(go())
        assert waits(primary) >= 4


@needs_redis
def test_a_primary_without_replicas_is_not_waited_for() -> None:
    with local_redis() as server:

        async def go() -> None:
            async with waiting(server.url) as store:
                applied, took = await write(store, [Run("alone")])
                assert applied == [Applied.WRITTEN] and took < WAIT

        before = waits(server)
        asyncio.run(go())
        assert waits(server) == before


@needs_cluster
def test_on_a_cluster_each_primary_waits_for_its_own_replica() -> None:
    with running_cluster(3, replicas=1, node_timeout=5000) as cluster:
        runs = [Run(f"run-{i}") for i in range(24)]
        by_port: dict[int, list[Run]] = {}
        for run in runs:
            node = cluster.primary_of(f"rg:{{{run.id}}}:state")
            by_port.setdefault(int(node.url.rsplit(":", 1)[1].split("/")[0]), []).append(run)
        assert len(by_port) == 3, "the runs do not cover every primary"
        lagging = cluster.node(next(iter(by_port)))
        replica = cluster.replica_of(lagging)

        async def go() -> None:
            async with waiting(cluster.url) as store:
                applied, _ = await write(store, runs)
                assert set(applied) == {Applied.WRITTEN}
                with frozen(replica):
                    applied, _ = await write(store, runs)
                behind = {run.id for run in by_port[next(iter(by_port))]}
                for run, result in zip(runs, applied, strict=True):
                    assert result is (
                        Applied.UNREPLICATED if run.id in behind else Applied.WRITTEN
                    ), run.id

        asyncio.run(go())
        assert all(waits(node) >= 2 for node in cluster.nodes[:3])


# -- the writer: what it does with UNREPLICATED, and with a store that fails -------------------


class Failing:
    """A store that fails every write until ``up``, then answers ``answer``."""

    shared = True

    def __init__(self) -> None:
        self.up = False
        self.answer = Applied.WRITTEN

    async def owner_key(self) -> bytes:
        return b"key"

    async def write(self, flushes: Sequence[Flush]) -> list[Applied]:
        if not self.up:
            raise ConnectionError("down")
        return [self.answer for _ in flushes]


def test_events_wait_through_a_store_failure_for_unprotected_after_then_go_out() -> None:
    metrics = Metrics()
    store = Failing()
    run = Run("held")
    hold = 0.3

    async def go() -> None:
        writer = CheckpointWriter(
            store,  # type: ignore[arg-type]
            metrics,
            lease_ttl=60,
            unprotected_after=hold,
        )
        run.add()
        writer.mark(run)
        assert not await writer.write_due()
        assert run.unflushed_count == 0 and writer.protecting  # held: it may be a failover
        await asyncio.sleep(hold / 2)
        assert not await writer.write_due()
        assert run.unflushed_count == 0 and writer.protecting
        await asyncio.sleep(hold / 2 + PROBE_WAIT)
        assert not await writer.write_due()
        assert run.unflushed_count == 1 and not writer.protecting  # out, unprotected
        # Back: rewritten whole, and held again at the next failure.
        store.up = True
        assert await writer.write_due()
        assert run.rewrites[-1] and run.flushed_seq == 1 and writer.protecting
        # No replica acknowledged: not acknowledged, so held as through a failure (a
        # deposed primary takes writes a failover lost), sent again, counted apart.
        store.answer = Applied.UNREPLICATED
        run.add()
        writer.mark(run)
        assert await writer.write_due()
        assert run.flushed_seq == 1 and run.unflushed_count == 1
        assert writes(metrics, "unreplicated") == 1 and writes(metrics, "ok") == 1
        await asyncio.sleep(hold / 2)
        assert await writer.write_due()  # sent again: still held
        assert run.flushed_seq == 1 and writes(metrics, "unreplicated") == 2
        await asyncio.sleep(hold / 2 + PROBE_WAIT)
        assert await writer.write_due()  # held for unprotected_after: it goes out, counted
        assert run.flushed_seq == 2 and writes(metrics, "unreplicated") == 3
        run.add()
        writer.mark(run)
        assert await writer.write_due()  # still none acknowledged: the next go out at once
        assert run.flushed_seq == 3 and writes(metrics, "unreplicated") == 4
        store.answer = Applied.WRITTEN
        run.add()
        writer.mark(run)
        assert await writer.write_due()  # acknowledged again: held again at the next one
        assert run.flushed_seq == 4 and writes(metrics, "ok") == 2
        store.answer = Applied.UNREPLICATED
        run.add()
        writer.mark(run)
        assert await writer.write_due()
        assert run.flushed_seq == 4

    asyncio.run(go())


@pytest.mark.parametrize("hold", [0.0])
def test_without_a_hold_events_go_out_at_the_first_failure(hold: float) -> None:
    store = Failing()
    run = Run("at-once")

    async def go() -> None:
        writer = CheckpointWriter(
            store,  # type: ignore[arg-type]
            Metrics(),
            lease_ttl=60,
            unprotected_after=hold,
        )
        run.add()
        writer.mark(run)
        assert not await writer.write_due()
        assert run.unflushed_count == 1 and not writer.protecting

    asyncio.run(go())
