"""Waiting for replicas: what a write to each primary must have acknowledged, and which
node is the primary.

Replication (``durability: sync``): after a batch of writes, ``WAIT`` asks the
primary that took them for replicas' acknowledgements (``state.wait_replicas``; auto:
one where the primary has, or ever had, a replica, learned every few seconds), on the
connection that wrote them (WAIT covers what its own connection wrote): the scripts
and their WAIT go in one pipeline (``pipelined``), on a standalone or Sentinel primary
and on each Cluster primary alike. A replica that does not answer within
``state.wait_timeout`` makes those writes unreplicated (held by the writer, then
counted), and its primary is then only probed briefly per write until a replica
acknowledges again: a frozen replica costs one wait, not one per write.

``auto`` never falls back to no acknowledgement on a primary that had replicas: a
paused primary that Sentinel deposed comes back still a primary, with no replica
left (they follow the promoted one), and would take writes that a failover already
lost. Known by address, so a promoted replica is a new primary, learned afresh.

Which node is the primary (Sentinel): the sentinels are asked again every few
seconds, within a second of a failed or unacknowledged write, and after the process
was idle or paused for a second: a new address drops the pool's idle connections to
the old one (redis-py's ``get_master_address``). Its replication id (``master_replid``,
new on every promotion) is learned with it, and every write script checks it on the
node that runs it (``RedisStore``): a connection still open to a deposed primary
cannot write, whatever the pool thought.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError, NoScriptError

REPLICAS_CHECK = 5.0  # seconds between looks at how many replicas each primary has
INFO_TIMEOUT = 1.0  # seconds a primary may take to say how many replicas it has
PROBE_WAIT = 0.01  # seconds a primary whose replicas fell behind waits for them, per write
STANDALONE = ""  # the name of the only primary (standalone; Sentinel's: its address)
PAUSED = 1.0  # seconds without a write or a look: the process may have been paused

Command = tuple[Any, ...]  # a command's name and arguments, as Redis takes them


class Replicas:
    """How many replicas each primary's writes wait for, which primaries' replicas fell
    behind, and (standalone, Sentinel) which node is the primary now."""

    def __init__(self, wanted: int | None, wait_timeout: float) -> None:
        """``wanted``: replicas that must acknowledge each write; None: one where the
        primary has, or once had, a replica, none where it never had (``auto``)."""
        self._wanted = wanted
        self._wait_timeout = wait_timeout
        self._replicas: dict[str, int] = {}  # connected replicas by primary (auto only)
        self._had: set[str] = set()  # primaries once seen with a replica (auto only)
        self._checked = -math.inf  # loop time of the last look
        self._active = -math.inf  # loop time of the last write or look: a pause shows
        self._behind: set[str] = set()  # primaries whose replicas did not answer in time
        self.primary = STANDALONE  # the primary's name: its address on Sentinel
        self.replid = ""  # its replication id ("": not known, not checked)
        self.changes = 0  # primaries replaced (Sentinel): the writer rewrites its runs

    @property
    def waits(self) -> bool:
        """Whether writes may wait for replicas (the writer allows for it)."""
        return self._wanted != 0

    @property
    def wait_timeout(self) -> float:
        return self._wait_timeout

    def required(self, primary: str) -> int:
        """How many replicas must acknowledge a write to ``primary``."""
        if self._wanted is not None:
            return self._wanted
        return 1 if self._replicas.get(primary, 0) or primary in self._had else 0

    def wait_ms(self, primary: str) -> int:
        wait = PROBE_WAIT if primary in self._behind else self._wait_timeout
        return max(1, int(wait * 1000))  # WAIT 0 would wait forever

    def acknowledged(self, primary: str, acked: Any, required: int) -> bool:
        """Whether WAIT's answer ``acked`` covers ``required``; remembers who fell behind."""
        if int(acked) >= required:
            self._behind.discard(primary)
            return True
        self._behind.add(primary)
        return False

    def soon(self) -> None:
        """A write failed: a failover may be under way, so what has replicas is learned
        again within a second (not at every write, or a primary that does not answer
        would slow every write by its look)."""
        now = asyncio.get_running_loop().time()
        self._checked = min(self._checked, now - REPLICAS_CHECK + 1.0)

    def forget(self) -> None:
        """The primaries changed (a Cluster's slot map is read again): look again now."""
        self._checked = -math.inf

    def _count(self, primary: str, replicas: int) -> None:
        self._replicas[primary] = replicas
        if replicas:
            self._had.add(primary)

    async def learn(self, client: Any, unreachable: Callable[[], None]) -> None:
        """Which node is the primary, and how many replicas each primary has now: every
        few seconds, so a replica added, lost or promoted changes what is waited for;
        sooner after a failure (``soon``) or a pause. ``unreachable`` is called when a
        Cluster primary did not answer (where are its slots now)."""
        now = asyncio.get_running_loop().time()
        paused, self._active = now - self._active > PAUSED, now
        if now - self._checked < REPLICAS_CHECK and not paused:
            return
        self._checked = now
        if isinstance(client, RedisCluster):
            if self._wanted is None:
                await self._learn_cluster(client, unreachable)
            return
        pool = client.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            # The sentinels name the primary now; a new address drops the pool's idle
            # connections to the old one (its busy ones are closed as they come back).
            host, port = await asyncio.wait_for(
                pool.get_master_address(),  # type: ignore[no-untyped-call]
                INFO_TIMEOUT,
            )
            primary = f"{host}:{port}"
            if primary != self.primary:
                self.changes += self.primary != STANDALONE  # the first one is no change
                self.primary, self.replid = primary, ""
        if self._wanted == 0 and not isinstance(pool, SentinelConnectionPool):
            return  # nothing waited for, and no failover to tell apart
        info = await asyncio.wait_for(client.info("replication"), INFO_TIMEOUT)
        if info.get("role") != "master":  # the pool reached a node that is not primary
            raise ConnectionError(f"{self.primary or 'the primary'} is not a primary now")
        if isinstance(pool, SentinelConnectionPool):
            self.replid = str(info.get("master_replid", ""))
        self._count(self.primary, int(info.get("connected_slaves", 0)))

    async def _learn_cluster(self, client: RedisCluster, unreachable: Callable[[], None]) -> None:
        await client.initialize()
        primaries = client.get_primaries()
        # Each primary's answer bounded: one that does not answer keeps what was known.
        infos = await asyncio.gather(
            *(
                asyncio.wait_for(node.execute_command("INFO", "replication"), INFO_TIMEOUT)
                for node in primaries
            ),
            return_exceptions=True,
        )
        if any(isinstance(info, BaseException) for info in infos):
            unreachable()
        for node, info in zip(primaries, infos, strict=True):
            if isinstance(info, dict):
                self._count(node.name, int(info.get("connected_slaves", 0)))


async def pipelined(
    execute: Callable[[list[Command]], Awaitable[list[Any]]],
    load_script: Callable[[], Awaitable[object]],
    scripts: Sequence[Command],
    wait: Command | None,
) -> tuple[list[Any], Any]:
    """``scripts`` (``EVALSHA`` calls) and then ``wait`` (a ``WAIT``), in one pipeline
    on one connection: the replies of the scripts (an exception where one failed) and
    the WAIT's (None without one). A primary that does not know the script (restarted,
    or a replica promoted since it was loaded: ``NOSCRIPT``) has it loaded, and the
    pipeline is sent once more."""
    commands = [*scripts, wait] if wait is not None else list(scripts)
    for attempt in range(2):
        replies = await execute(commands)
        ran = replies[: len(scripts)]
        if attempt == 0 and any(isinstance(reply, NoScriptError) for reply in ran):
            await load_script()
            continue
        break
    return ran, replies[-1] if wait is not None else None
