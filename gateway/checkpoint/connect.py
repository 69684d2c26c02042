"""Reaching Redis from one URL: standalone (``redis[s]://``), Cluster
(``redis[s]+cluster://``) or Sentinel (``redis+sentinel://``), with one quick retry on
a stale connection and no more."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, TimeoutError

# A command that fails on a stale pooled connection (a Redis restarted, a failover, an
# idle connection a NAT dropped) is sent once more, at once, on a fresh connection,
# before its error surfaces. redis-py does it: the connection is closed and opened
# again between the two tries (on a Cluster, after re-reading the slot map), so the
# second try reaches the Redis that is there now. Once, not redis-py's default of
# ten tries with backoff: a Redis that is really down must fail fast, the writer and
# readiness have their own bounds, and a Cluster client would otherwise re-read the
# slot map ten times per command to a dead primary.
RETRY_ON = [ConnectionError, TimeoutError]


def _retry() -> Retry:
    return Retry(NoBackoff(), 1)


def connect(url: str, pool_size: int) -> Any:
    """A client for ``url``: redis[s]://, redis[s]+cluster:// or redis+sentinel://."""
    scheme, _, rest = url.partition("://")
    if scheme.endswith("+cluster"):
        return RedisCluster.from_url(
            f"{scheme.removesuffix('+cluster')}://{rest}",
            max_connections=pool_size,
            retry=_retry(),
            retry_on_error=RETRY_ON,
        )
    if scheme == "redis+sentinel":
        # redis+sentinel://[:password@]host:port[,host:port…]/service[/db]
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2]
        nodes = [
            (h.rpartition(":")[0] or h, int(h.rpartition(":")[2] or 26379))
            for h in hosts.split(",")
        ]
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ValueError("a redis+sentinel:// URL names the service: …/mymaster[/db]")
        password = unquote(parts.password) if parts.password else None
        # The sentinels too: a dead one is skipped after one retry, not ten with backoff.
        sentinel_kwargs = {"password": password, "retry": _retry(), "retry_on_error": RETRY_ON}
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            nodes, password=password, sentinel_kwargs=sentinel_kwargs
        )
        db = int(path[1]) if len(path) > 1 else 0
        return sentinel.master_for(
            path[0],
            db=db,
            max_connections=pool_size,
            retry=_retry(),
            retry_on_error=RETRY_ON,
        )
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=5, retry=_retry(), retry_on_error=RETRY_ON
    )
    return redis.Redis(connection_pool=pool)
