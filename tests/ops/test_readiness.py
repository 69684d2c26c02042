"""``/readyz`` follows Redis: it turns 503 within a second or two of Redis dying,
on standalone, Cluster and Sentinel, and 200 again once it is back or failed over,
each answer within the store check's bound (0.5 s), however busy the gateway's own
Redis connections. On a Cluster, a primary that answers but says the cluster cannot
serve every slot (``cluster_state:fail``) is not ready either.

The gateway runs in-process; Redis is the test's own ``redis-server`` (killed with
SIGKILL, or frozen with SIGSTOP, which is what a network partition looks like).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import redis
from redis.crc import key_slot

from gateway.chaos import ChaosUpstream
from gateway.checkpoint.model import Flush, RunRecord, RunState, owner_hash
from gateway.checkpoint.redis import RedisStore
from gateway.context import STORE_CHECK_TIMEOUT
from tests.redis_cluster import running_cluster
from tests.redis_server import RedisServer, frozen, role, running_redis, running_sentinels
from tests.servers import RunningGateway, gateway_config, running_gateway

SLACK = 0.25  # seconds a loaded 2-core machine may add to an answer
# Seconds a just-started gateway may take to say it is ready: its first store check
# opens the connections (to every node of a cluster), which a loaded machine can make
# outlast STORE_CHECK_TIMEOUT once (seen: a cluster's first check, under the full suite).
STARTING = 3.0


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        if server.process is None:
            pytest.skip("needs a local redis-server to kill or freeze")
        yield server


def readiness(gateway: RunningGateway) -> tuple[int, str | None, float]:
    """Status, reason and how long ``/readyz`` took to answer."""
    started = time.monotonic()
    response = httpx2.get(gateway.url + "/readyz", timeout=5)
    reason: str | None = response.json().get("reason")
    return response.status_code, reason, time.monotonic() - started


def wait_for_readiness(gateway: RunningGateway, status: int, within: float) -> str | None:
    """Probe until ``/readyz`` answers ``status``, as a prober would; its reason."""
    deadline = time.monotonic() + within
    while True:
        got, reason, took = readiness(gateway)
        assert took < STORE_CHECK_TIMEOUT + SLACK, f"/readyz took {took:.2f} s"
        if got == status:
            return reason
        assert time.monotonic() < deadline, f"/readyz still {got} ({reason}) after {within} s"
        time.sleep(0.05)


def durable_gateway(chaos: ChaosUpstream, url: str, **state: Any) -> Any:
    return running_gateway(gateway_config(chaos.base_url, state={"redis_url": url} | state))


def test_readyz_turns_503_within_a_second_of_redis_being_killed_and_200_when_it_is_back(
    chaos: ChaosUpstream, redis_server: RedisServer
) -> None:
    with durable_gateway(chaos, redis_server.url) as gateway:
        wait_for_readiness(gateway, 200, within=STARTING)
        redis_server.stop()  # SIGKILL
        killed = time.monotonic()
        reason = wait_for_readiness(gateway, 503, within=2)
        assert time.monotonic() - killed < 1
        assert reason is not None and reason.startswith("redis unreachable")
        assert gateway.metrics.registry.get_sample_value("gateway_ready") == 0
        redis_server.restart()  # same port, empty
        wait_for_readiness(gateway, 200, within=3)
        assert gateway.metrics.registry.get_sample_value("gateway_ready") == 1


def test_readyz_answers_503_within_its_bound_when_redis_is_frozen(
    chaos: ChaosUpstream, redis_server: RedisServer
) -> None:
    # A frozen Redis (or a partition, or a host that vanished) answers nothing, not
    # even a reset: only the check's own timeout can say it is gone.
    with durable_gateway(chaos, redis_server.url) as gateway:
        wait_for_readiness(gateway, 200, within=STARTING)
        with frozen(redis_server):
            status, reason, took = readiness(gateway)
            assert status == 503, reason
            assert reason == "redis unreachable: TimeoutError"
            assert took < STORE_CHECK_TIMEOUT + SLACK
        wait_for_readiness(gateway, 200, within=3)


def test_readyz_stays_ready_and_quick_while_tails_hold_every_pooled_connection(
    chaos: ChaosUpstream, redis_server: RedisServer
) -> None:
    # A run another replica relays: a resume here tails it with blocking reads (up to
    # a second each), on the only connection of a pool of one.
    run_id = "relayed-elsewhere"

    async def store_a_live_run() -> None:
        store = RedisStore(redis_server.url)
        try:
            owner = owner_hash(await store.owner_key(), None)
            record = RunRecord(run_id, owner, "*", {"model": "m"}, 0.0).encode()
            state = RunState(seq=1, status="running", leg=0, splice_leg=0).encode()
            event = b'data: {"choices": []}\n\n'
            await store.write(
                [Flush(run_id, 1, event, 1, state, record, lease="other", lease_ttl=60)]
            )
        finally:
            await store.aclose()

    asyncio.run(store_a_live_run())
    with (
        durable_gateway(chaos, redis_server.url, pool_size=1, lease_ttl=60) as gateway,
        httpx2.stream("GET", f"{gateway.base_url}/runs/{run_id}/events?after=1") as tail,
    ):
        assert tail.status_code == 200
        time.sleep(0.2)  # the tail is blocked in its first read
        for _ in range(5):
            status, reason, took = readiness(gateway)
            assert (status, reason) == (200, None)
            assert took < 0.2  # not queued behind a tail's read
            time.sleep(0.15)


def test_readyz_on_a_cluster_reports_any_dead_primary(chaos: ChaosUpstream) -> None:
    # A Cluster's PING goes to one node unless told otherwise; a run may live on any.
    with running_cluster() as cluster, durable_gateway(chaos, cluster.url) as gateway:
        wait_for_readiness(gateway, 200, within=STARTING)
        last = cluster.nodes[-1]  # serves slot 16383: not the node the URL names
        last.stop()
        reason = wait_for_readiness(gateway, 503, within=2)
        assert reason is not None and reason.startswith("redis unreachable")
        last.restart()  # rejoins with its slots (its nodes.conf survived)
        # It answers PING at once, but refuses every key (CLUSTERDOWN) for 2 s, until
        # it trusts its view of the cluster: not ready until then.
        assert readiness(gateway)[:2] == (503, "redis unreachable: ClusterStateError")
        wait_for_readiness(gateway, 200, within=5)
        key = next(k for k in (f"k{i}" for i in range(100_000)) if key_slot(k.encode()) == 16383)
        node = redis.Redis.from_url(last.url)
        try:
            assert node.set(key, b"1")  # ready: its slots take writes
        finally:
            node.close()


def check_readiness_through_failover(
    gateway: RunningGateway, primary: RedisServer, replica: RedisServer
) -> float:
    """Kill ``primary``: not ready within a second, and not until ``replica`` took over;
    ready within 2 s after. When it was killed (``time.monotonic()``)."""
    primary.stop()
    killed = time.monotonic()
    reason = wait_for_readiness(gateway, 503, within=1)
    assert reason is not None and reason.startswith("redis unreachable")
    while True:
        status = readiness(gateway)[0]  # asked before: it cannot see a later failover
        if role(replica) == "master":  # the first node to know it took over
            break
        assert status == 503, "ready before the failover"
        assert time.monotonic() - killed < 15, "no failover within 15 s"
        time.sleep(0.05)
    wait_for_readiness(gateway, 200, within=2)
    return killed


def test_readyz_on_a_cluster_follows_a_failover(chaos: ChaosUpstream) -> None:
    # A primary with a replica dies: not ready until the replica serves its slots,
    # ready again then, with the dead node still dead.
    with (
        running_cluster(replicas=1, node_timeout=1000) as cluster,
        durable_gateway(chaos, cluster.url) as gateway,
    ):
        wait_for_readiness(gateway, 200, within=STARTING)
        primary = cluster.nodes[0]  # the node the URL names, too
        check_readiness_through_failover(gateway, primary, cluster.replica_of(primary))


def test_readyz_on_a_cluster_is_503_while_a_primary_answers_but_cannot_serve_every_slot(
    chaos: ChaosUpstream,
) -> None:
    # Every primary answers PING, yet one says cluster_state:fail (here: a slot it
    # dropped; in a failover, the slots of a primary marked failed), and refuses keys.
    with running_cluster() as cluster, durable_gateway(chaos, cluster.url) as gateway:
        wait_for_readiness(gateway, 200, within=STARTING)
        node = redis.Redis.from_url(cluster.nodes[0].url)
        try:
            node.cluster("DELSLOTS", 0)
            reason = wait_for_readiness(gateway, 503, within=2)
            assert reason == "redis unreachable: ClusterStateError"
            node.cluster("ADDSLOTS", 0)
            wait_for_readiness(gateway, 200, within=3)
        finally:
            node.close()


def test_readyz_on_sentinel_follows_a_failover(chaos: ChaosUpstream) -> None:
    with (
        running_sentinels(down_after_ms=1000) as sentinels,
        durable_gateway(chaos, sentinels.url) as gateway,
    ):
        wait_for_readiness(gateway, 200, within=STARTING)
        replica = sentinels.servers[1]  # promoted once the primary is gone
        killed = check_readiness_through_failover(gateway, sentinels.primary(), replica)
        assert time.monotonic() - killed < 10
