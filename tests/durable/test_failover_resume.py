"""A stream through two gateway replicas on a Redis that fails over, then a replica that dies.

The Redis primary holding the run is SIGKILLed mid-stream (Sentinel: the primary;
Cluster: the primary of the run's slot), and the stream goes on while its
replica is promoted (events released unprotected meanwhile, then rewritten
whole). Once checkpoints are written again, the gateway replica relaying the run
is SIGKILLed too, and the client resumes on the other one: the answer must be
the uninterrupted one, byte for byte, from an upstream that chunks every attempt
differently.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from gateway.chaos import ChaosUpstream
from tests.api.streams import Received, assert_whole_text_answer
from tests.durable.two_replicas import drain, resume_on, started
from tests.processes import Replicas, replica_config, wait_until
from tests.redis_cluster import RedisClusterNodes
from tests.redis_server import RedisSentinels, RedisServer


@pytest.fixture
def replicas(
    topology: RedisSentinels | RedisClusterNodes, chaos: ChaosUpstream, tmp_path: Path
) -> Iterator[Replicas]:
    """The replicas of ``conftest.py`` on the ``topology`` instead."""
    config = replica_config(tmp_path / "gateway.yaml", chaos.base_url, topology.url)
    chaos.requests.clear()
    with Replicas(config, tmp_path) as running:
        yield running


def primary_holding(topology: RedisSentinels | RedisClusterNodes, run_id: str) -> RedisServer:
    """The Redis primary that holds the run now (Cluster: the primary of its slot)."""
    key = f"rg:{{{run_id}}}:state"
    return (
        topology.primary_of(key) if isinstance(topology, RedisClusterNodes) else topology.primary()
    )


def _state(topology: RedisSentinels | RedisClusterNodes, run_id: str) -> dict[str, object] | None:
    """The run's checkpoint state as the current primary has it; None while failing over."""
    key = f"rg:{{{run_id}}}:state"
    try:
        client = redis.Redis.from_url(primary_holding(topology, run_id).url, socket_timeout=1)
        try:
            raw = client.get(key)
        finally:
            client.close()
    except (redis.RedisError, RuntimeError, StopIteration):
        return None
    return None if raw is None else dict(orjson.loads(raw))


@pytest.mark.timeout(120)
def test_a_redis_failover_then_a_dead_replica_still_resume_exactly(
    topology: RedisSentinels | RedisClusterNodes, replicas: Replicas
) -> None:
    model = "chaos:text=400,seed=71,pace_ms=20,rechunk=1"
    a, b = replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 10) as (run_id, stream):
        primary = primary_holding(topology, run_id)
        assert primary.process is not None
        primary.process.kill()  # SIGKILL: the run's Redis primary is gone
        primary.process.wait(10)
        killed = time.monotonic()
        # The stream goes on through the failover; once it is over, the checkpoint
        # catches up with everything the client has (rewritten whole).
        for chunk in stream:
            received.feed(chunk)
            checkpoint = _state(topology, run_id) if time.monotonic() - killed > 1 else None
            if checkpoint is not None and int(str(checkpoint["seq"])) >= received.chunks:
                if time.monotonic() - killed > 2:
                    break
        else:
            pytest.fail("the answer ended before the failover was over")
        a.freeze()
        a.kill()
        drain(stream, received)
    assert received.finish_reasons == [], "A finished before it was killed"
    checkpoint = _state(topology, run_id)
    assert checkpoint is not None and int(str(checkpoint["seq"])) >= received.chunks
    resume_on(b, model, run_id, received)
    assert_whole_text_answer(received, model)
    wait_until(lambda: b.resumed("takeover") == 1, "B took the run over")


@pytest.mark.timeout(120)
def test_a_resume_that_meets_the_failover_waits_for_the_promoted_primary(
    topology: RedisSentinels | RedisClusterNodes, replicas: Replicas
) -> None:
    """The run's replica and its Redis primary die together, and the client resumes on
    the other replica at once, while the replica is not promoted yet: the resume waits
    for it (a bounded time) and takes the run over, where it answered 503 before."""
    model = "chaos:text=200,seed=72,pace_ms=20,rechunk=1"
    a, b = replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 10) as (run_id, stream):
        wait_until(
            lambda: int(str((_state(topology, run_id) or {}).get("seq", 0))) >= 10,
            "A checkpoints what the client has",
        )
        primary = primary_holding(topology, run_id)
        assert primary.process is not None
        a.freeze()
        primary.process.kill()
        a.kill()
        drain(stream, received)
    resume_on(b, model, run_id, received)
    assert_whole_text_answer(received, model)
    wait_until(lambda: b.resumed("takeover") == 1, "B took the run over")
