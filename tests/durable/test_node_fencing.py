"""Writes fenced by node (issue 40): a primary that is no longer the primary cannot add to a
run, whatever the pool of a gateway still has open to it.

Real Redis processes: a primary, its replica and three sentinels. The case that left
streams silently wrong under an outside nemesis: the primary is paused past the
sentinels' down-after, the replica is promoted, and the old primary wakes up still a
primary, with no replica left, until the sentinels reconfigure it. A gateway's pooled
connection to it must not be able to write there, nor be told its write was safe.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import redis
from redis.exceptions import ConnectionError, ResponseError

from gateway.chaos import ChaosUpstream
from gateway.checkpoint.model import Applied
from gateway.checkpoint.redis import CLUSTER_RUN_TIMEOUT, RedisStore
from gateway.checkpoint.scripts import NOT_PRIMARY, run_keys
from gateway.checkpoint.writer import CheckpointWriter
from gateway.metrics import Metrics
from tests.api.streams import MESSAGES, Received
from tests.durable.test_redis_topologies import Run, needs_cluster, needs_redis, opened
from tests.durable.test_replicated_writes import WAIT, stored, waiting, write
from tests.durable.two_replicas import started
from tests.processes import Replicas, replica_config, wait_until
from tests.redis_cluster import RedisClusterNodes, port_of, running_cluster
from tests.redis_server import (
    RedisSentinels,
    RedisServer,
    frozen,
    local_redis,
    role,
    running_sentinels,
)


def promoted(topology: RedisSentinels, old: RedisServer, within: float = 20) -> RedisServer:
    """Wait until the sentinels name another primary than ``old``; that one."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        port = topology.primary_port()
        if port is not None and not old.url.endswith(f":{port}/0"):
            return topology.primary()
        time.sleep(0.1)
    raise AssertionError("the sentinels never promoted the replica")


@needs_redis
def test_a_deposed_primary_that_wakes_up_still_a_primary_takes_no_write() -> None:
    with running_sentinels(down_after_ms=1000, failover_timeout_ms=3000) as topology:
        old, replica = topology.servers
        run = Run("deposed")

        async def go() -> None:
            store = RedisStore(topology.url, wait_replicas=None, wait_timeout=WAIT)
            fence = RedisStore(old.url)  # a connection straight to the old primary
            try:
                applied, _ = await write(store, [run])
                assert applied == [Applied.WRITTEN]
                # The pool holds a connection to the primary as it is now. Paused past
                # down-after, it is deposed while it sleeps; woken, it is a primary still.
                with frozen(old):
                    new = promoted(topology, old)
                    assert new is replica
                assert role(old) == "master"  # for a few seconds: the window that mattered
                before = stored(old, run)
                # 1. A process that has not noticed anything (no pause, no failure: the
                # look at the sentinels is not due) writes on its pooled connection to the
                # old primary: it had a replica, so a replica must acknowledge, and none
                # does (it follows the promoted one now): not acknowledged, held.
                loop = asyncio.get_running_loop()
                store._replicas._active = store._replicas._checked = loop.time()  # noqa: SLF001
                run.add()
                applied = await store.write([run.flush(b"key", rewrite=False)])
                assert applied == [Applied.UNREPLICATED]
                # 2. Once the promoted primary's replication id is known, a script on the
                # old primary refuses to write at all.
                new_id = redis.Redis.from_url(new.url).info("replication")["master_replid"]
                fence._replicas.replid = new_id  # noqa: SLF001
                with pytest.raises(ResponseError, match=NOT_PRIMARY.split()[0]):
                    await fence.write([run.flush(b"key", rewrite=False)])
                assert stored(old, run) == before + 1  # only the unacknowledged write
                # 3. The next writes ask the sentinels again (an unacknowledged write makes
                # it due), and land on the promoted primary, each run rewritten whole.
                deadline = time.monotonic() + 10
                while True:
                    try:
                        applied = await store.write([run.flush(b"key", rewrite=True)])
                    except (ConnectionError, ResponseError):
                        applied = [Applied.FAILED]
                    if applied == [Applied.WRITTEN]:
                        break
                    assert time.monotonic() < deadline, f"not written to the new primary: {applied}"
                    await asyncio.sleep(0.2)
                assert store.primary_changes == 1
                assert stored(new, run) == len(run.events)
            finally:
                await store.aclose()
                await fence.aclose()

        asyncio.run(go())


@needs_redis
def test_a_primary_whose_replica_left_is_still_waited_for() -> None:
    with running_sentinels() as topology:
        primary, replica = topology.servers
        run = Run("left")

        async def go() -> None:
            async with waiting(primary.url) as store:
                assert (await write(store, [run]))[0] == [Applied.WRITTEN]
                # The replica leaves cleanly (as one reconfigured to follow another does).
                client = redis.Redis.from_url(replica.url)
                try:
                    client.replicaof("NO", "ONE")
                finally:
                    client.close()
                store._replicas.forget()  # noqa: SLF001 - look again at once, not in 5 s
                applied, _ = await write(store, [run])
                # auto once asked one replica of this primary: it does not fall to none.
                assert applied == [Applied.UNREPLICATED]

        asyncio.run(go())


@needs_redis
def test_a_claim_no_replica_acknowledged_is_not_a_claim() -> None:
    with running_sentinels() as topology:
        primary, replica = topology.servers
        run = Run("claimed")

        async def go() -> None:
            async with waiting(primary.url) as store:
                assert (await write(store, [run]))[0] == [Applied.WRITTEN]
                with frozen(replica):
                    lease = run_keys(run.id)[3]
                    client = redis.Redis.from_url(primary.url)
                    try:
                        client.delete(lease)  # its owner died: nobody holds it
                    finally:
                        client.close()
                    with pytest.raises(ConnectionError, match="acknowledged the claim"):
                        await store.claim(run.id, "b/1", 5.0)
                # Acknowledged now: the claim (the same one, idempotent) stands.
                deadline = time.monotonic() + 5
                while True:
                    try:
                        epoch = await store.claim(run.id, "b/1", 5.0)
                        break
                    except ConnectionError:
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.2)
                assert epoch == 1

        asyncio.run(go())


@needs_redis
def test_a_flush_sent_again_is_stored_once() -> None:
    with local_redis() as server:
        run = Run("twice")

        async def go() -> None:
            async with opened(server.url) as store:
                run.add(3)
                flush = run.flush(b"key", rewrite=False)
                assert await store.write([flush]) == [Applied.WRITTEN]
                run.add(2)  # not acknowledged: sent again with what came since
                assert await store.write([run.flush(b"key", rewrite=False)]) == [Applied.WRITTEN]
                checkpoint = await store.load(run.id)
                assert checkpoint is not None and checkpoint.events == run.events
                assert await store.read_events(run.id, 2) == list(enumerate(run.events[2:], 3))
                state = orjson.loads(
                    redis.Redis.from_url(server.url).get(run_keys(run.id)[2]) or b""
                )
                assert state["seq"] == 5

        asyncio.run(go())


# -- a Cluster's per-primary path (with replicas): NOSCRIPT, MOVED, a blackholed primary -------


def _by_primary(cluster: RedisClusterNodes, runs: list[Run]) -> dict[int, list[Run]]:
    by_port: dict[int, list[Run]] = {}
    for run in runs:
        node = cluster.primary_of(f"rg:{{{run.id}}}:state")
        by_port.setdefault(port_of(node), []).append(run)
    return by_port


@needs_cluster
def test_a_cluster_primary_that_forgot_the_script_or_lost_its_slots_is_written_again() -> None:
    with running_cluster(3, replicas=1, node_timeout=3000) as cluster:
        runs = [Run(f"moved-{i}") for i in range(12)]
        first_port = next(iter(_by_primary(cluster, runs)))
        primary = cluster.node(first_port)
        replica = cluster.replica_of(primary)

        async def go() -> None:
            async with waiting(cluster.url) as store:
                assert set((await write(store, runs))[0]) == {Applied.WRITTEN}
                # NOSCRIPT: the primary forgot the script (a restart, a promotion).
                redis.Redis.from_url(primary.url).script_flush()
                assert set((await write(store, runs))[0]) == {Applied.WRITTEN}
                # MOVED: its replica takes its slots over (a manual failover).
                redis.Redis.from_url(replica.url).execute_command("CLUSTER", "FAILOVER")  # type: ignore[no-untyped-call]
                deadline = time.monotonic() + 15
                while cluster.primary_of(f"rg:{{{runs[0].id}}}:state") is not replica:
                    assert time.monotonic() < deadline, "the failover never happened"
                    await asyncio.sleep(0.1)
                deadline = time.monotonic() + 15
                while True:  # the first write may meet MOVED: the next ones find the slots
                    applied, _ = await write(store, runs)
                    if set(applied) == {Applied.WRITTEN}:
                        break
                    assert time.monotonic() < deadline, f"never written after MOVED: {applied}"
                    await asyncio.sleep(0.2)
                for run in runs:
                    assert stored(cluster.primary_of(f"rg:{{{run.id}}}:state"), run) == len(
                        run.events
                    )

        asyncio.run(go())


@needs_cluster
def test_a_blackholed_cluster_primary_fails_its_runs_alone_and_in_bounded_time() -> None:
    with running_cluster(3, replicas=1, node_timeout=5000) as cluster:
        runs = [Run(f"hole-{i}") for i in range(12)]
        by_port = _by_primary(cluster, runs)
        port = next(iter(by_port))

        async def go() -> None:
            async with waiting(cluster.url) as store:
                assert set((await write(store, runs))[0]) == {Applied.WRITTEN}
                with frozen(cluster.node(port)):  # it takes the packets, answers none
                    applied, took = await write(store, runs)
                cut = {run.id for run in by_port[port]}
                for run, result in zip(runs, applied, strict=True):
                    assert result is (Applied.FAILED if run.id in cut else Applied.WRITTEN)
                assert took < CLUSTER_RUN_TIMEOUT + WAIT + 1.0

        asyncio.run(go())


# -- the writer's hold counts from the write's start ----------------------------------------


class Hanging:
    """A store whose writes never answer (a primary that takes packets and says nothing)."""

    shared = True

    async def owner_key(self) -> bytes:
        return b"key"

    async def write(self, flushes: Any) -> list[Applied]:
        await asyncio.sleep(60)
        return []


def test_a_hanging_store_holds_events_for_the_hold_counted_from_the_write_start() -> None:
    run = Run("hung")

    async def go() -> None:
        writer = CheckpointWriter(
            Hanging(),  # type: ignore[arg-type]
            Metrics(),
            lease_ttl=60,
            write_timeout=0.6,
            unprotected_after=0.5,
        )
        run.add()
        writer.mark(run)
        assert not await writer.write_due()  # gave up after 0.6 s: held 0.6 s already
        assert run.unflushed_count == 1 and not writer.protecting

    asyncio.run(go())


# -- a tail gives out only what a replica acknowledged ------------------------------------------


@needs_redis
@pytest.mark.timeout(120)
def test_a_tail_gives_out_only_what_a_replica_acknowledged(
    chaos: ChaosUpstream, tmp_path: Path
) -> None:
    """The owner's writes land on the primary, but its replica (frozen) acknowledges none:
    the owner holds those events from its clients, and a client following the run from
    another replica must not get them either (a failover could still lose them, and the
    run would go on from the store without them: that client would then be ahead)."""
    with running_sentinels() as topology:
        primary, replica = topology.servers
        config = replica_config(
            tmp_path / "gateway.yaml",
            chaos.base_url,
            topology.url,
            state={"unprotected_after": 60, "wait_timeout": 0.3},
        )
        model = "chaos:text=300,seed=73,pace_ms=20"
        key = "rg:{{{}}}:state"
        with Replicas(config, tmp_path) as replicas:
            a, b = replicas.start("A", "B")
            received = Received()
            with started(a, model, received, 5) as (run_id, stream):
                store = redis.Redis.from_url(primary.url)

                def state_now() -> dict[str, Any]:
                    state: dict[str, Any] = orjson.loads(store.get(key.format(run_id)) or b"{}")
                    return state

                with frozen(replica):
                    wait_until(
                        lambda: state_now().get("seq", 0) > (state_now().get("acked") or 0) + 5,
                        "the owner writes what no replica acknowledges",
                    )
                    headers = {
                        "authorization": "Bearer sk-owner",
                        "x-run-id": run_id,
                        "x-resume-from": str(received.chunks),
                    }
                    body = {"model": model, "messages": MESSAGES, "stream": True}
                    tailed = b""
                    with httpx2.Client(timeout=httpx2.Timeout(10, read=1.0)) as http:
                        with http.stream(
                            "POST", b.base_url + "/chat/completions", json=body, headers=headers
                        ) as response:
                            assert response.status_code == 200
                            try:
                                for part in response.iter_raw():
                                    tailed += part
                            except httpx2.ReadTimeout:
                                pass  # nothing more comes while no replica acknowledges
                    acked = state_now()["acked"]
                    given = received.chunks + tailed.count(b"data: ")
                    assert given <= acked < state_now()["seq"]
                stream.close()


@needs_redis
def test_a_log_is_never_stored_with_a_gap() -> None:
    """A write whose first event is past the end of the stored log (a failover lost the
    end, or it went out unacknowledged) is refused for a rewrite, not appended: a log
    with a gap would put every later position one event off."""
    with local_redis() as server:
        run = Run("gap")

        async def go() -> None:
            async with opened(server.url) as store:
                run.add(5)
                assert await store.write([run.flush(b"key", rewrite=False)]) == [Applied.WRITTEN]
                run.add(4)
                run.flushed_seq = 7  # as if events 6 and 7 had been written and lost
                assert await store.write([run.flush(b"key", rewrite=False)]) == [Applied.GAP]
                checkpoint = await store.load(run.id)
                assert checkpoint is not None and checkpoint.events == run.events[:5]
                applied = await store.write([run.flush(b"key", rewrite=True)])
                assert applied == [Applied.WRITTEN]
                checkpoint = await store.load(run.id)
                assert checkpoint is not None and checkpoint.events == run.events

        asyncio.run(go())


def test_the_writer_rewrites_a_run_whose_log_would_have_a_gap() -> None:
    class Gapped:
        shared = True
        answers = [Applied.GAP, Applied.WRITTEN]

        async def owner_key(self) -> bytes:
            return b"key"

        async def write(self, flushes: Any) -> list[Applied]:
            return [self.answers.pop(0) for _ in flushes]

    run = Run("gapped")
    metrics = Metrics()

    async def go() -> None:
        writer = CheckpointWriter(Gapped(), metrics, lease_ttl=60)  # type: ignore[arg-type]
        run.add(3)
        writer.mark(run)
        assert await writer.write_due()
        assert run.flushed_seq == 0  # not written: held, and due again
        assert await writer.write_due()
        assert run.rewrites == [False, True] and run.flushed_seq == 3

    asyncio.run(go())
    assert metrics.checkpoint_writes.labels("gap")._value.get() == 1
