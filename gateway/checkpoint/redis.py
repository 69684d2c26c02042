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

Replication (``durability: sync``): a batch's scripts and their ``WAIT`` go in one
pipeline per primary (``replication.py`` says what is waited for, and how long);
writes a replica did not acknowledge in time are ``UNREPLICATED``.

Fencing (see ``store``): the script first compares the flush's epoch with the
run's, and skips the whole flush when they differ; a claim sets the lease and
raises the epoch in one script, and is acknowledged by a replica as checkpoints are
(a claim a failover lost would leave two owners with one epoch). The epoch key is
written only once a run has been claimed, and a deleted run keeps it until it
expires, so a writer that wakes up after the run was finished and deleted cannot
bring it back either.

Epochs live on the node that takes the writes, so they fence owners, not nodes. A
node that is no longer the primary (Sentinel: a paused primary deposed while it
slept, which wakes up still a primary) is fenced apart: every script, checkpoint or
claim, first checks that the node that runs it is the primary the sentinels name
now, by its replication id (``master_replid``, new on every promotion: learned with
the primary, ``replication.py``), and refuses (``NOTPRIMARY``) otherwise. Its cost:
one ``INFO replication`` inside the script, once per batch of checkpoints, not per
event. On a Cluster, whose nodes learn their own demotion, the replica's
acknowledgement is the fence: a primary that had replicas is always waited for.

A checkpoint that was written but not acknowledged is sent again (the writer holds
its events): its log entry is appended only if the stream does not have it yet, and
a reader takes each event once (``scripts.log_entries``), so a resent flush changes
nothing. The scripts themselves, their keys and their replies: ``scripts.py``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError, MovedError

from gateway.checkpoint.connect import connect
from gateway.checkpoint.model import Applied, Checkpoint, Flush, RunRecord, RunState
from gateway.checkpoint.replication import Command, Replicas, pipelined
from gateway.checkpoint.scripts import (
    CLAIM_SCRIPT,
    WRITE_SCRIPT,
    acknowledged,
    log_entries,
    per_run,
    run_keys,
    write_args,
)

OWNER_KEY = "rg:owner-key"
CLUSTER_RUN_TIMEOUT = 1.0  # seconds one run's write may take on a Cluster (the writer's: 2)


class ClusterStateError(ConnectionError):
    """A Cluster primary answers, but says the cluster cannot serve every slot."""


def _per_node(infos: Any) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(infos, dict) and "cluster_state" in infos:
        return [("the only primary", infos)]
    return list(infos.items())


async def _reread(cluster: RedisCluster) -> None:
    try:
        await cluster.nodes_manager.initialize()
    except Exception:  # noqa: BLE001 - nobody answers yet: the next failure asks again
        return


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
        self._replicas = Replicas(wait_replicas, wait_timeout)
        self._refresh: asyncio.Task[None] | None = None  # a Cluster slot map being read again
        self._sentinel = not isinstance(self._redis, RedisCluster) and isinstance(
            self._redis.connection_pool, SentinelConnectionPool
        )

    @property
    def waits(self) -> bool:
        """Whether writes may wait for replicas (the writer allows for it)."""
        return self._replicas.waits

    @property
    def primary_changes(self) -> int:
        """Primaries replaced so far (Sentinel): the writer rewrites its runs whole on a
        new one, which may not have had their last writes."""
        return self._replicas.changes

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
            self._replicas.soon()  # a failover may be under way
            raise

    async def _write(self, flushes: Sequence[Flush]) -> list[Applied]:
        replicas = self._replicas
        await replicas.learn(self._redis, self._reread_all)
        if isinstance(self._redis, RedisCluster):
            if self.waits:
                return await self._write_by_primary(self._redis, flushes)
            # A run's keys share a slot, different runs' do not: one call per run, and
            # a run whose slot cannot be written (its primary died, and no replica has
            # taken over yet) fails alone: the others' writes stand.
            replies = await asyncio.gather(
                *(self._write_run(f) for f in flushes), return_exceptions=True
            )
            return per_run(replies)
        keys: list[str] = []
        args: list[bytes | str | int] = []
        for f in flushes:
            keys.extend(run_keys(f.run_id))
            args.extend(write_args(f))
        args.append(replicas.replid)  # the primary the sentinels name, checked there
        # The whole batch in one command: redis-py spends ~30 µs per command it
        # packs and parses, so six commands per run would cost more than Redis.
        primary = replicas.primary
        required = replicas.required(primary)
        if not required:
            return [Applied(applied) for applied in await self._write_script(keys, args)]
        (replies,), acked = await pipelined(
            self._pipeline,
            self._load_script,
            [("EVALSHA", self._write_script.sha, len(keys), *keys, *args)],
            ("WAIT", required, replicas.wait_ms(primary)),
        )
        for reply in (replies, acked):
            if isinstance(reply, Exception):
                raise reply
        replicated = replicas.acknowledged(primary, acked, required)
        if not replicated:
            replicas.soon()  # no replica answered: is this node still the primary?
        return acknowledged(replies, replicated)

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        """``commands`` on one connection; a failed command's reply is its exception."""
        pipe = self._redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def _load_script(self) -> None:
        await self._redis.script_load(WRITE_SCRIPT)

    async def _write_by_primary(
        self, cluster: RedisCluster, flushes: Sequence[Flush]
    ) -> list[Applied]:
        """Each primary's runs in one pipeline with its WAIT (on a Cluster, with replicas)."""
        await cluster.initialize()  # learns the slot map on first use (then a no-op)
        results: list[Applied] = [Applied.FAILED] * len(flushes)
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        for i, flush in enumerate(flushes):
            try:
                node = cluster.get_node_from_key(run_keys(flush.run_id)[0])
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
        replicas = self._replicas
        required = replicas.required(node.name)

        wait = ("WAIT", required, replicas.wait_ms(node.name)) if required else None
        scripts = [
            ("EVALSHA", self._write_script.sha, 6, *run_keys(f.run_id), *write_args(f), "")
            for f in flushes
        ]
        async with asyncio.timeout(CLUSTER_RUN_TIMEOUT + (replicas.wait_timeout if wait else 0)):
            replies, acked = await self._on_node(node, scripts, wait, WRITE_SCRIPT)
        if any(isinstance(r, MovedError) for r in replies):
            self._reread_slots(self._redis)  # the slots moved (a failover): learn where
        if not required:
            return per_run(replies)
        if isinstance(acked, Exception):
            raise acked
        replicated = replicas.acknowledged(node.name, acked, required)
        if not replicated:
            replicas.soon()  # no replica answered: has the Cluster failed this node over?
        return [
            a if a is Applied.FAILED else acknowledged([a], replicated)[0] for a in per_run(replies)
        ]

    def _reread_all(self) -> None:
        assert isinstance(self._redis, RedisCluster)
        self._reread_slots(self._redis)

    def _reread_slots(self, cluster: RedisCluster) -> None:
        """Read the Cluster's slot map again, once at a time, in the background."""
        if self._refresh is None or self._refresh.done():
            self._replicas.forget()  # and its primaries' replicas
            self._refresh = asyncio.get_running_loop().create_task(_reread(cluster))

    async def _write_run(self, flush: Flush) -> Any:
        """One run's flush on a Cluster, bounded: a primary that does not answer (a
        blackholed node) fails this run, not the whole batch at the writer's timeout."""
        async with asyncio.timeout(CLUSTER_RUN_TIMEOUT):
            return await self._write_script(run_keys(flush.run_id), [*write_args(flush), ""])

    async def _reading(self) -> Any:
        """A pipeline for reads that only the primary may answer: on Sentinel it begins
        with ``INFO replication``, which ``_read`` checks (a deposed primary, or a replica
        a stale connection reaches, could say a run is not there, or hold writes the
        failover lost)."""
        pipe = self._redis.pipeline(transaction=False)
        if self._sentinel:
            await self._replicas.learn(self._redis, self._reread_all)
            pipe.info("replication")
        return pipe

    async def _read(self, pipe: Any) -> list[Any]:
        """``pipe``'s replies, without the check ``_reading`` put first (which raises
        ``ConnectionError`` when the node that answered is not the primary)."""
        replies: list[Any] = await pipe.execute()
        if not self._sentinel:
            return replies
        info, *replies = replies
        expected = self._replicas.replid
        if info.get("role") != "master" or (expected and info.get("master_replid") != expected):
            self._replicas.soon()
            raise ConnectionError("the node that answered is not the primary the sentinels name")
        return replies

    async def load(self, run_id: str) -> Checkpoint | None:
        record, events, state, *_ = run_keys(run_id)
        pipe = await self._reading()
        pipe.get(record)
        pipe.get(state)
        pipe.xrange(events, "-", "+")
        raw_record, raw_state, entries = await self._read(pipe)
        if raw_record is None or raw_state is None:
            return None
        log: list[bytes] = []
        for seq, event in log_entries(entries, 0):
            if seq != len(log) + 1:
                break  # a gap (a log a release before issue 40 stored): only its prefix
            log.append(event)
        return Checkpoint(RunRecord.decode(raw_record), RunState.decode(raw_state), log)

    async def read_events(
        self, run_id: str, after: int, block: float = 0
    ) -> list[tuple[int, bytes]]:
        events = run_keys(run_id)[1]
        if not self._sentinel:
            if block > 0:
                reply = await self._redis.xread({events: f"0-{after}"}, block=int(block * 1000))
                return log_entries(reply[0][1] if reply else [], after)
            return log_entries(await self._redis.xrange(events, f"(0-{after}", "+"), after)
        pipe = await self._reading()
        if block > 0:
            pipe.xread({events: f"0-{after}"}, block=int(block * 1000))
            (reply,) = await self._read(pipe)
            raw = reply[0][1] if reply else []
        else:
            pipe.xrange(events, f"(0-{after}", "+")
            (raw,) = await self._read(pipe)
        return log_entries(raw, after)

    async def lease_holder(self, run_id: str) -> str | None:
        if not self._sentinel:
            holder = await self._redis.get(run_keys(run_id)[3])
        else:
            pipe = await self._reading()
            pipe.get(run_keys(run_id)[3])
            (holder,) = await self._read(pipe)
        return None if holder is None else bytes(holder).decode()

    async def released(self, run_id: str) -> int | None:
        pipe = await self._reading()
        pipe.get(run_keys(run_id)[2])
        (raw,) = await self._read(pipe)
        return None if raw is None else RunState.decode(raw).released()

    async def set_alias(self, name: str, run_id: str, ttl: float) -> None:
        await self._redis.set(f"rg:alias:{name}", run_id, px=int(ttl * 1000))

    async def get_alias(self, name: str) -> str | None:
        run_id = await self._redis.get(f"rg:alias:{name}")
        return None if run_id is None else bytes(run_id).decode()

    async def claim(self, run_id: str, claim: str, ttl: float) -> int | None:
        """Claim the run (its lease, a new epoch), acknowledged by a replica where writes
        are: a claim a failover lost would leave two owners of one epoch. Raises
        ``ConnectionError`` when no replica acknowledged it in time (the resumer asks
        again, a while: ``Resumes``)."""
        replicas = self._replicas
        await replicas.learn(self._redis, self._reread_all)
        _, _, state, lease, _, epoch = keys = run_keys(run_id)
        node: ClusterNode | None = None
        primary, check = replicas.primary, replicas.replid
        if isinstance(self._redis, RedisCluster):
            await self._redis.initialize()
            node = self._redis.get_node_from_key(state)
            if node is None:
                raise ConnectionError(f"no Cluster primary serves run {keys[0]!r} now")
            primary, check = node.name, ""
        claim_args = [claim, int(ttl * 1000), check]
        required = replicas.required(primary)
        if not required:
            claimed = await self._claim_script([state, lease, epoch], claim_args)
            return None if claimed is None else int(claimed)
        script = ("EVALSHA", self._claim_script.sha, 3, state, lease, epoch, *claim_args)
        wait = ("WAIT", required, replicas.wait_ms(primary))
        if node is None:
            (reply,), acked = await pipelined(self._pipeline, self._load_claim, [script], wait)
        else:
            (reply,), acked = await self._on_node(node, [script], wait, CLAIM_SCRIPT)
        for answer in (reply, acked):
            if isinstance(answer, Exception):
                raise answer
        if not replicas.acknowledged(primary, acked, required):
            replicas.soon()
            raise ConnectionError(f"no replica acknowledged the claim of run {keys[0]!r}")
        return None if reply is None else int(reply)

    async def _load_claim(self) -> None:
        await self._redis.script_load(CLAIM_SCRIPT)

    async def _on_node(
        self, node: ClusterNode, scripts: list[Command], wait: Command | None, source: str
    ) -> tuple[list[Any], Any]:
        """``scripts`` and ``wait`` in one pipeline on a Cluster ``node`` (``pipelined``)."""

        async def execute(commands: list[Command]) -> list[Any]:
            piped = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
            await node.execute_pipeline(piped)
            return [command.result for command in piped]

        async def load_script() -> None:
            await node.execute_command("SCRIPT", "LOAD", source)

        return await pipelined(execute, load_script, scripts, wait)

    async def watch(self, run_id: str, ttl: float) -> None:
        await self._redis.set(run_keys(run_id)[4], b"1", px=int(ttl * 1000))

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
