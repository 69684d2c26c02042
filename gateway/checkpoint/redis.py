"""The Redis checkpoint store: shared by every replica (standalone, Sentinel or Cluster).

Keys per run, with a hash tag so that a run's keys share a Cluster slot::

    rg:{RUN}:record   string  RunRecord (orjson), written once
    rg:{RUN}:events   stream  entries 0-LAST: {f: FIRST, d: events FIRST..LAST concatenated}
    rg:{RUN}:state    string  RunState (orjson), replaced at each checkpoint
    rg:{RUN}:lease    string  replica owning the run, PX lease_ttl, renewed by its writes
    rg:{RUN}:watch    string  set by a replica tailing the run: checkpoint every event
    rg:{RUN}:epoch    string  the run's epoch, raised by each claim; absent: 0 (never claimed)

Why a Stream for the log: entry ids are the event numbers, so a resumer reads
"everything after event n" with one XRANGE, and a live tail on another replica
is a blocking XREAD from the same position, with no gap between the two (a
pub/sub message published while the tailer was reading the backlog would be lost).
Appending costs one XADD per checkpoint, whatever the answer's length. A batch of
checkpoints is one script call (per run on a Cluster, where runs live in
different slots): every step of a run's write happens, in order, in one place.

Replication (``durability: sync``): after a batch of writes, ``WAIT`` asks the
primary that took them for at least one replica's acknowledgement (``state.
wait_replicas``; auto: where the primary has a replica), on the connection that
wrote them (WAIT covers what its own connection wrote). On a Cluster, each
primary's runs go in one pipeline with their WAIT. A replica that does not answer
within ``state.wait_timeout`` makes those writes ``UNREPLICATED`` (their events go
out, counted), and its primary is then only probed briefly per write until a
replica acknowledges again: a frozen replica costs one wait, not one per write.

Fencing (see ``store``): the script first compares the flush's epoch with the
run's, and skips the whole flush when they differ; a claim sets the lease and
raises the epoch in one script. The epoch key is written only once a run has been
claimed, and a deleted run keeps it until it expires, so a writer that wakes up
after the run was finished and deleted cannot bring it back either.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as redis
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, MovedError, NoScriptError, TimeoutError

from gateway.checkpoint.model import Applied, Checkpoint, Flush, RunRecord, RunState, split_events

OWNER_KEY = "rg:owner-key"
CLUSTER_RUN_TIMEOUT = 1.0  # seconds one run's write may take on a Cluster (the writer's: 2)
REPLICAS_CHECK = 5.0  # seconds between looks at how many replicas each primary has
PROBE_WAIT = 0.01  # seconds a primary whose replicas fell behind waits for them, per write
STANDALONE = ""  # the name of the only primary (standalone, Sentinel's master)

# KEYS: record, events, state, lease, watch, epoch per run; ARGV: _write_args per run.
# Returns, per run, an ``Applied``: 2 if fenced out, else whether a replica watches it.
WRITE_SCRIPT = """
local out = {}
for i = 0, #KEYS / 6 - 1 do
  local k, a = i * 6, i * 10
  local record, events, state, lease = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local epoch = ARGV[a + 10]
  local current = redis.call('GET', KEYS[k + 6])
  local ttl = tonumber(ARGV[a + 6])
  if (current or '0') ~= epoch then
    out[i + 1] = 2
  else
    if ttl <= 0 then
      redis.call('DEL', record, events, state, lease)
    else
      local flags = ARGV[a + 1]
      if string.find(flags, 'r') then redis.call('DEL', events) end
      if ARGV[a + 2] ~= '' then redis.call('SET', record, ARGV[a + 2], 'PX', ttl) end
      if ARGV[a + 5] ~= '' then
        redis.call('XADD', events, '0-' .. ARGV[a + 4], 'f', ARGV[a + 3], 'd', ARGV[a + 5])
      end
      if string.find(flags, 'e') then
        redis.call('PEXPIRE', record, ttl)
        redis.call('PEXPIRE', events, ttl)
      end
      redis.call('SET', state, ARGV[a + 7], 'PX', ttl)
      if ARGV[a + 8] ~= '' then
        redis.call('SET', lease, ARGV[a + 8], 'PX', ARGV[a + 9])
      else
        redis.call('DEL', lease)
      end
      if epoch ~= '0' then redis.call('SET', KEYS[k + 6], epoch, 'PX', ttl) end
    end
    out[i + 1] = redis.call('EXISTS', KEYS[k + 5])
  end
end
return out
"""

# KEYS: state, lease, epoch; ARGV: claim (unique to this claim), lease ms. The run's new
# epoch, or nil when the lease is held or the run is not stored. Idempotent: a claim sent
# again (its reply was lost, and redis-py retried it) finds its own lease and gets the
# epoch it raised, instead of losing to itself.
CLAIM_SCRIPT = """
local held = redis.call('GET', KEYS[2])
if held == ARGV[1] then return tonumber(redis.call('GET', KEYS[3])) end
if held or redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local epoch = redis.call('INCR', KEYS[3])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) end
return epoch
"""


def _write_args(f: Flush) -> list[bytes | str | int]:
    flags = ("r" if f.reset else "") + ("e" if f.expire or f.record is not None else "")
    return [
        flags or "-",
        f.record or b"",
        f.first_seq,
        f.last_seq,
        f.events,
        int(f.ttl * 1000),
        f.state,
        f.lease or "",
        int(f.lease_ttl * 1000),
        f.epoch,
    ]


def _keys(run_id: str) -> tuple[str, str, str, str, str, str]:
    tag = f"rg:{{{run_id}}}:"
    return (
        tag + "record",
        tag + "events",
        tag + "state",
        tag + "lease",
        tag + "watch",
        tag + "epoch",
    )


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


class ClusterStateError(ConnectionError):
    """A Cluster primary answers, but says the cluster cannot serve every slot."""


def _per_node(infos: Any) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(infos, dict) and "cluster_state" in infos:
        return [("the only primary", infos)]
    return list(infos.items())


def _per_run(replies: Sequence[Any]) -> list[Applied]:
    """Each run's script reply, or FAILED for an error; raises if every run failed (the
    store is down, as on standalone)."""
    failures = [reply for reply in replies if isinstance(reply, BaseException)]
    if failures and len(failures) == len(replies):
        raise failures[0]
    return [
        Applied.FAILED if isinstance(reply, BaseException) else Applied(_applied(reply))
        for reply in replies
    ]


def _applied(reply: Any) -> int:
    return int(reply[0] if isinstance(reply, list) else reply)


def _replicated(replies: Sequence[Any], replicated: bool) -> list[Applied]:
    """Script replies as ``Applied``; a write no replica acknowledged is UNREPLICATED
    (a fenced one stays FENCED: nothing was written)."""
    out = [Applied(_applied(reply)) for reply in replies]
    if replicated:
        return out
    return [a if a is Applied.FENCED else Applied.UNREPLICATED for a in out]


async def _reread(cluster: RedisCluster) -> None:
    try:
        await cluster.nodes_manager.initialize()
    except Exception:  # noqa: BLE001 - nobody answers yet: the next failure asks again
        return


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
    shared = True

    def __init__(
        self,
        url: str,
        pool_size: int = 64,
        *,
        wait_replicas: int | None = 0,
        wait_timeout: float = 2.0,
    ) -> None:
        """``wait_replicas``: replicas that must acknowledge each write (``WAIT``); None:
        one where the primary has a replica, none where it has not."""
        self._redis = connect(url, pool_size)
        # Readiness asks on a connection of its own: a busy pool (a tail's blocking read
        # holds a connection for up to a second) must not look like a dead Redis.
        self._probe = connect(url, 1)
        self._write_script = self._redis.register_script(WRITE_SCRIPT)
        self._claim_script = self._redis.register_script(CLAIM_SCRIPT)
        self._wanted = wait_replicas
        self._wait_timeout = wait_timeout
        self._replicas: dict[str, int] = {}  # connected replicas by primary (auto only)
        self._replicas_checked = -math.inf  # loop time of the last look
        self._behind: set[str] = set()  # primaries whose replicas did not answer in time
        self._refresh: asyncio.Task[None] | None = None  # a Cluster slot map being read again

    @property
    def waits(self) -> bool:
        """Whether writes may wait for replicas (the writer allows for it)."""
        return self._wanted != 0

    async def ping(self) -> None:
        """Raise unless Redis can serve every run now.

        Standalone: it answers. Sentinel: the sentinels name a master that is up, and
        it answers. Cluster: every primary answers (a run may be on any; a plain PING
        asks one node), and each says the cluster is ok: while a primary's slots wait
        for a failover, the others refuse every key (CLUSTERDOWN) yet answer a PING.
        """
        probe = self._probe
        if isinstance(probe, RedisCluster):
            infos = await probe.cluster_info(target_nodes=RedisCluster.PRIMARIES)
            # One node's answer is its info; several nodes', a dict of them by node.
            states = {node: info.get("cluster_state") for node, info in _per_node(infos)}
            failing = sorted(node for node, state in states.items() if state != "ok")
            if failing:
                raise ClusterStateError(f"cluster_state not ok on {', '.join(failing)}")
            # The runs' client learns every node while the cluster is healthy (a no-op
            # once it has): started lazily, it would know only the node in the URL, and
            # could not start at all if that node died before its first command.
            await self._redis.initialize()
            return
        pool = probe.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            # Asks the sentinels (raises MasterNotFoundError if none names a master that
            # is up); a new address drops the probe's idle connection to the old one.
            await pool.get_master_address()  # type: ignore[no-untyped-call]
        await probe.ping()

    async def owner_key(self) -> bytes:
        # The first replica to ask creates the key; every other one reads the same.
        await self._redis.set(OWNER_KEY, secrets.token_hex(32), nx=True)
        key: bytes = await self._redis.get(OWNER_KEY)
        return key

    async def write(self, flushes: Sequence[Flush]) -> list[Applied]:
        try:
            return await self._write(flushes)
        except BaseException:
            # A failover may be under way: what has replicas is learned again soon (within
            # a second: not at every write, or a primary that does not answer would slow
            # every write by its look).
            now = asyncio.get_running_loop().time()
            self._replicas_checked = min(self._replicas_checked, now - REPLICAS_CHECK + 1.0)
            raise

    async def _write(self, flushes: Sequence[Flush]) -> list[Applied]:
        if self.waits:
            await self._learn_replicas()
        if isinstance(self._redis, RedisCluster):
            if self.waits:
                return await self._write_by_primary(self._redis, flushes)
            # A run's keys share a slot, different runs' do not: one call per run, and
            # a run whose slot cannot be written (its primary died, and no replica has
            # taken over yet) fails alone: the others' writes stand.
            replies = await asyncio.gather(
                *(self._write_run(f) for f in flushes), return_exceptions=True
            )
            return _per_run(replies)
        keys: list[str] = []
        args: list[bytes | str | int] = []
        for f in flushes:
            keys.extend(_keys(f.run_id))
            args.extend(_write_args(f))
        # The whole batch in one command: redis-py spends ~30 µs per command it
        # packs and parses, so six commands per run would cost more than Redis.
        required = self._required(STANDALONE)
        if not required:
            return [Applied(applied) for applied in await self._write_script(keys, args)]
        # The script and its WAIT on one connection (a pipeline).
        for attempt in range(2):
            pipe = self._redis.pipeline(transaction=False)
            pipe.evalsha(self._write_script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", required, self._wait_ms(STANDALONE))
            replies, acked = await pipe.execute(raise_on_error=False)
            if isinstance(replies, NoScriptError) and attempt == 0:
                await self._redis.script_load(WRITE_SCRIPT)  # a Redis restarted or replaced
                continue
            for reply in (replies, acked):
                if isinstance(reply, Exception):
                    raise reply
            break
        return _replicated(replies, self._acknowledged(STANDALONE, acked, required))

    async def _write_by_primary(
        self, cluster: RedisCluster, flushes: Sequence[Flush]
    ) -> list[Applied]:
        """Each primary's runs in one pipeline with its WAIT (on a Cluster, with replicas)."""
        await cluster.initialize()  # learns the slot map on first use (then a no-op)
        results: list[Applied] = [Applied.FAILED] * len(flushes)
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        for i, flush in enumerate(flushes):
            try:
                node = cluster.get_node_from_key(_keys(flush.run_id)[0])
            except Exception:  # noqa: BLE001 - a slot nobody serves now: this run fails alone
                node = None
            if node is None:
                self._reread_slots(cluster)
                continue
            groups.setdefault(node.name, (node, []))[1].append(i)
        replies = await asyncio.gather(
            *(
                self._write_primary(node, [flushes[i] for i in runs])
                for node, runs in groups.values()
            ),
            return_exceptions=True,
        )
        for (_, runs), reply in zip(groups.values(), replies, strict=True):
            if isinstance(reply, BaseException):
                self._reread_slots(cluster)  # dead, or no longer a primary: where is it now
                continue
            for i, applied in zip(runs, reply, strict=True):
                results[i] = applied
        if len(flushes) and all(r is Applied.FAILED for r in results):
            raise ConnectionError("no Cluster primary took its runs' checkpoints")
        return results

    async def _write_primary(self, node: ClusterNode, flushes: Sequence[Flush]) -> list[Applied]:
        required = self._required(node.name)
        async with asyncio.timeout(CLUSTER_RUN_TIMEOUT + (self._wait_timeout if required else 0)):
            for attempt in range(2):
                commands = [
                    PipelineCommand(
                        i, "EVALSHA", self._write_script.sha, 6, *_keys(f.run_id), *_write_args(f)
                    )
                    for i, f in enumerate(flushes)
                ]
                if required:
                    commands.append(
                        PipelineCommand(len(flushes), "WAIT", required, self._wait_ms(node.name))
                    )
                await node.execute_pipeline(commands)
                replies = [command.result for command in commands[: len(flushes)]]
                if attempt == 0 and any(isinstance(r, NoScriptError) for r in replies):
                    await node.execute_command("SCRIPT", "LOAD", WRITE_SCRIPT)
                    continue
                break
        if any(isinstance(r, MovedError) for r in replies):
            self._reread_slots(self._redis)  # the slots moved (a failover): learn where
        if not required:
            return _per_run(replies)
        acked = commands[-1].result
        if isinstance(acked, Exception):
            raise acked
        replicated = self._acknowledged(node.name, acked, required)
        return [
            a if a is Applied.FAILED else _replicated([a], replicated)[0] for a in _per_run(replies)
        ]

    def _required(self, primary: str) -> int:
        """How many replicas must acknowledge a write to ``primary``."""
        if self._wanted is not None:
            return self._wanted
        return 1 if self._replicas.get(primary, 0) else 0

    def _wait_ms(self, primary: str) -> int:
        wait = PROBE_WAIT if primary in self._behind else self._wait_timeout
        return max(1, int(wait * 1000))  # WAIT 0 would wait forever

    def _acknowledged(self, primary: str, acked: Any, required: int) -> bool:
        if int(acked) >= required:
            self._behind.discard(primary)
            return True
        self._behind.add(primary)
        return False

    async def _learn_replicas(self) -> None:
        """How many replicas each primary has now (``state.wait_replicas: auto``): every
        few seconds, so a replica added, lost or promoted changes what is waited for."""
        if self._wanted is not None:
            return
        now = asyncio.get_running_loop().time()
        if now - self._replicas_checked < REPLICAS_CHECK:
            return
        self._replicas_checked = now
        redis_ = self._redis
        if isinstance(redis_, RedisCluster):
            await redis_.initialize()
            primaries = redis_.get_primaries()
            # Each primary's answer bounded: one that does not answer keeps what was known.
            infos = await asyncio.gather(
                *(
                    asyncio.wait_for(
                        node.execute_command("INFO", "replication"), CLUSTER_RUN_TIMEOUT
                    )
                    for node in primaries
                ),
                return_exceptions=True,
            )
            if any(isinstance(info, BaseException) for info in infos):
                self._reread_slots(redis_)
            # A primary that did not answer keeps what was known of it.
            self._replicas.update(
                (node.name, int(info.get("connected_slaves", 0)))
                for node, info in zip(primaries, infos, strict=True)
                if isinstance(info, dict)
            )
        else:
            info = await asyncio.wait_for(redis_.info("replication"), CLUSTER_RUN_TIMEOUT)
            self._replicas = {STANDALONE: int(info.get("connected_slaves", 0))}

    def _reread_slots(self, cluster: RedisCluster) -> None:
        """Read the Cluster's slot map again, once at a time, in the background."""
        if self._refresh is None or self._refresh.done():
            self._replicas_checked = -math.inf  # and its primaries' replicas
            self._refresh = asyncio.get_running_loop().create_task(_reread(cluster))

    async def _write_run(self, flush: Flush) -> Any:
        """One run's flush on a Cluster, bounded: a primary that does not answer (a
        blackholed node) fails this run, not the whole batch at the writer's timeout."""
        async with asyncio.timeout(CLUSTER_RUN_TIMEOUT):
            return await self._write_script(_keys(flush.run_id), _write_args(flush))

    async def load(self, run_id: str) -> Checkpoint | None:
        record, events, state, *_ = _keys(run_id)
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

    async def set_alias(self, name: str, run_id: str, ttl: float) -> None:
        await self._redis.set(f"rg:alias:{name}", run_id, px=int(ttl * 1000))

    async def get_alias(self, name: str) -> str | None:
        run_id = await self._redis.get(f"rg:alias:{name}")
        return None if run_id is None else bytes(run_id).decode()

    async def claim(self, run_id: str, claim: str, ttl: float) -> int | None:
        _, _, state, lease, _, epoch = _keys(run_id)
        claimed = await self._claim_script([state, lease, epoch], [claim, int(ttl * 1000)])
        return None if claimed is None else int(claimed)

    async def watch(self, run_id: str, ttl: float) -> None:
        await self._redis.set(_keys(run_id)[4], b"1", px=int(ttl * 1000))

    async def aclose(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
        for client in (self._redis, self._probe):
            if isinstance(client, RedisCluster):
                await client.aclose()
            else:  # a pool passed in is not closed by default
                await client.aclose(close_connection_pool=True)
                if isinstance(client.connection_pool, SentinelConnectionPool):
                    # Its connections to the sentinels: not the client's to close.
                    await client.connection_pool.sentinel_manager.aclose()
