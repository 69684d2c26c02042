"""Waiting for replicas: what a write to each primary must have acknowledged.

Replication (``durability: sync``): after a batch of writes, ``WAIT`` asks the
primary that took them for replicas' acknowledgements (``state.wait_replicas``; auto:
one where the primary has a replica, learned every few seconds), on the connection
that wrote them (WAIT covers what its own connection wrote): the scripts and their
WAIT go in one pipeline (``pipelined``), on a standalone or Sentinel primary and on
each Cluster primary alike. A replica that does not answer within
``state.wait_timeout`` makes those writes unreplicated (their events go out,
counted), and its primary is then only probed briefly per write until a replica
acknowledges again: a frozen replica costs one wait, not one per write.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

REPLICAS_CHECK = 5.0  # seconds between looks at how many replicas each primary has
INFO_TIMEOUT = 1.0  # seconds a primary may take to say how many replicas it has
PROBE_WAIT = 0.01  # seconds a primary whose replicas fell behind waits for them, per write
STANDALONE = ""  # the name of the only primary (standalone, Sentinel's master)

Command = tuple[Any, ...]  # a command's name and arguments, as Redis takes them


class Replicas:
    """How many replicas each primary's writes wait for, and which primaries' replicas
    fell behind."""

    def __init__(self, wanted: int | None, wait_timeout: float) -> None:
        """``wanted``: replicas that must acknowledge each write; None: one where the
        primary has a replica, none where it has not (``auto``)."""
        self._wanted = wanted
        self._wait_timeout = wait_timeout
        self._replicas: dict[str, int] = {}  # connected replicas by primary (auto only)
        self._checked = -math.inf  # loop time of the last look
        self._behind: set[str] = set()  # primaries whose replicas did not answer in time

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
        return 1 if self._replicas.get(primary, 0) else 0

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

    async def learn(self, client: Any, unreachable: Callable[[], None]) -> None:
        """How many replicas each primary has now (``auto``): every few seconds, so a
        replica added, lost or promoted changes what is waited for. ``unreachable`` is
        called when a Cluster primary did not answer (where are its slots now)."""
        if self._wanted is not None:
            return
        now = asyncio.get_running_loop().time()
        if now - self._checked < REPLICAS_CHECK:
            return
        self._checked = now
        if isinstance(client, RedisCluster):
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
            self._replicas.update(
                (node.name, int(info.get("connected_slaves", 0)))
                for node, info in zip(primaries, infos, strict=True)
                if isinstance(info, dict)
            )
        else:
            standalone: redis.Redis = client
            info = await asyncio.wait_for(standalone.info("replication"), INFO_TIMEOUT)
            self._replicas = {STANDALONE: int(info.get("connected_slaves", 0))}


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
