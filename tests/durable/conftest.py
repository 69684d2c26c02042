"""Two gateway replicas on one real redis-server, for the tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import redis

from gateway.chaos import ChaosUpstream
from tests.processes import Replicas, replica_config
from tests.redis_cluster import RedisClusterNodes, running_cluster
from tests.redis_server import RedisSentinels, RedisServer, running_redis, running_sentinels


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def store(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def replicas(chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path) -> Iterator[Replicas]:
    """Replicas with the default durability, sync: no client is ever ahead of the store."""
    config = replica_config(tmp_path / "gateway.yaml", chaos.base_url, redis_server.url)
    chaos.requests.clear()
    with Replicas(config, tmp_path) as running:
        yield running


@pytest.fixture
def async_replicas(
    chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Replicas]:
    """Replicas with durability: async, whose clients can be ahead of the checkpoint."""
    folder = tmp_path / "async"
    folder.mkdir()
    path = folder / "gateway.yaml"
    config = replica_config(path, chaos.base_url, redis_server.url, durability="async")
    chaos.requests.clear()
    with Replicas(config, folder) as running:
        yield running


@pytest.fixture(params=["sentinel", "cluster"])
def topology(request: pytest.FixtureRequest) -> Iterator[RedisSentinels | RedisClusterNodes]:
    """A Redis with a replica that fails over in seconds: Sentinel or Cluster."""
    manager: AbstractContextManager[RedisSentinels | RedisClusterNodes]
    if request.param == "sentinel":
        manager = running_sentinels(down_after_ms=1000, failover_timeout_ms=3000)
    else:
        manager = running_cluster(3, replicas=1, node_timeout=1000)
    with manager as running:
        yield running
