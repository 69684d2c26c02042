"""The Redis checkpoint store: shared by every replica (standalone, Sentinel or Cluster).

Keys per run, with a hash tag so that a run's keys share a Cluster slot::

    rg:{RUN}:record   string  RunRecord (orjson), written once
    rg:{RUN}:events   stream  entries 0-LAST: {f: FIRST, d: events FIRST..LAST concatenated}
    rg:{RUN}:state    string  RunState (orjson), replaced at each checkpoint
    rg:{RUN}:lease    string  replica owning the run, PX lease_ttl, renewed by its writes
    rg:{RUN}:watch    string  set by a replica tailing the run: checkpoint every event

Why a Stream for the log: entry ids are the event numbers, so a resumer reads
"everything after event n" with one XRANGE, and a live tail on another replica
is a blocking XREAD from the same position, with no gap between the two (a
pub/sub message published while the tailer was reading the backlog would be lost).
Appending costs one XADD per checkpoint, whatever the answer's length.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from gateway.checkpoint.model import Checkpoint, Flush, RunRecord, RunState, split_events

OWNER_KEY = "rg:owner-key"


def _keys(run_id: str) -> tuple[str, str, str, str, str]:
    tag = f"rg:{{{run_id}}}:"
    return tag + "record", tag + "events", tag + "state", tag + "lease", tag + "watch"


def connect(url: str, pool_size: int) -> Any:
    """A client for ``url``: redis[s]://, redis[s]+cluster:// or redis+sentinel://."""
    scheme, _, rest = url.partition("://")
    if scheme.endswith("+cluster"):
        return RedisCluster.from_url(
            f"{scheme.removesuffix('+cluster')}://{rest}", max_connections=pool_size
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
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            nodes, password=password, sentinel_kwargs={"password": password}
        )
        db = int(path[1]) if len(path) > 1 else 0
        return sentinel.master_for(path[0], db=db, max_connections=pool_size)
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=pool_size, timeout=5)
    return redis.Redis(connection_pool=pool)


def _entries(raw: list[Any], after: int) -> list[tuple[int, bytes]]:
    out = []
    for entry_id, fields in raw:
        last = int(entry_id.split(b"-")[1])
        first = int(fields[b"f"])
        for seq, event in enumerate(split_events(fields[b"d"]), first):
            if seq > after and seq <= last:
                out.append((seq, event))
    return out


class RedisStore:
    def __init__(self, url: str, pool_size: int = 64) -> None:
        self._redis = connect(url, pool_size)

    async def ping(self) -> None:
        await self._redis.ping()

    async def owner_key(self) -> bytes:
        # The first replica to ask creates the key; every other one reads the same.
        await self._redis.set(OWNER_KEY, secrets.token_hex(32), nx=True)
        key: bytes = await self._redis.get(OWNER_KEY)
        return key

    async def write(self, flushes: Sequence[Flush]) -> list[bool]:
        pipe = self._redis.pipeline(transaction=False)
        ends: list[int] = []
        for f in flushes:
            record, events, state, lease, watch = _keys(f.run_id)
            if f.ttl <= 0:
                pipe.delete(record, events, state, lease)
                pipe.exists(watch)
                ends.append(len(pipe))
                continue
            ttl = int(f.ttl * 1000)
            if f.reset:
                pipe.delete(events)
            if f.record is not None:
                pipe.set(record, f.record, px=ttl)
            if f.events:
                pipe.xadd(events, {"f": f.first_seq, "d": f.events}, id=f"0-{f.last_seq}")
            if f.record is not None or f.expire:
                pipe.pexpire(record, ttl)
                pipe.pexpire(events, ttl)
            pipe.set(state, f.state, px=ttl)
            if f.lease is not None:
                pipe.set(lease, f.lease, px=int(f.lease_ttl * 1000))
            else:
                pipe.delete(lease)
            pipe.exists(watch)
            ends.append(len(pipe))
        results = await pipe.execute()
        # EXISTS watch is the last command of each flush.
        return [bool(results[end - 1]) for end in ends]

    async def load(self, run_id: str) -> Checkpoint | None:
        record, events, state, _, _ = _keys(run_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(record)
        pipe.get(state)
        pipe.xrange(events, "-", "+")
        raw_record, raw_state, entries = await pipe.execute()
        if raw_record is None or raw_state is None:
            return None
        log = [event for _, event in _entries(entries, 0)]
        return Checkpoint(RunRecord.decode(raw_record), RunState.decode(raw_state), log)

    async def read_events(
        self, run_id: str, after: int, block: float = 0
    ) -> list[tuple[int, bytes]]:
        events = _keys(run_id)[1]
        if block > 0:
            reply = await self._redis.xread({events: f"0-{after}"}, block=int(block * 1000))
            raw = reply[0][1] if reply else []
        else:
            raw = await self._redis.xrange(events, f"(0-{after}", "+")
        return _entries(raw, after)

    async def lease_holder(self, run_id: str) -> str | None:
        holder = await self._redis.get(_keys(run_id)[3])
        return None if holder is None else bytes(holder).decode()

    async def claim(self, run_id: str, replica: str, ttl: float) -> bool:
        return bool(await self._redis.set(_keys(run_id)[3], replica, nx=True, px=int(ttl * 1000)))

    async def watch(self, run_id: str, ttl: float) -> None:
        await self._redis.set(_keys(run_id)[4], b"1", px=int(ttl * 1000))

    async def aclose(self) -> None:
        if isinstance(self._redis, RedisCluster):
            await self._redis.aclose()
        else:  # a pool passed in is not closed by default
            await self._redis.aclose(close_connection_pool=True)
