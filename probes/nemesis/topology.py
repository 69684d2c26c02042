"""The replicated Redis the nemesis runs against, and what it does to it.

Sentinel: ``tests.redis_server.running_sentinels`` (a primary, one replica, three
sentinels, quorum 2, with the probe's down-after). Cluster:
``tests.redis_cluster.running_cluster`` (3 primaries with a replica each). Either
way the probe owns the processes: it SIGKILLs and SIGSTOPs them, and starts a
killed primary again as a replica of the node promoted in its place.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from tests.redis_cluster import RedisClusterNodes, port_of, running_cluster
from tests.redis_server import RedisSentinels, RedisServer, running_sentinels

STOPPED: set[int] = set()  # pids the nemesis SIGSTOPped and has not yet continued


def stop(process: subprocess.Popen[bytes]) -> None:
    STOPPED.add(process.pid)
    os.kill(process.pid, signal.SIGSTOP)


def cont(process: subprocess.Popen[bytes]) -> None:
    STOPPED.discard(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGCONT)


def continue_all() -> None:
    """SIGCONT whatever is still stopped (on the way out, so terminate() can work)."""
    for pid in list(STOPPED):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    STOPPED.clear()


def _info(port: int) -> dict[str, Any] | None:
    client = redis.Redis(port=port, socket_timeout=1, protocol=2)
    try:
        info: Any = client.info("replication")
        return dict(info)
    except redis.RedisError:
        return None
    finally:
        client.close()


def _base(command: list[str]) -> list[str]:
    """A redis-server command without its --replicaof (the probe adds its own)."""
    if "--replicaof" in command:
        at = command.index("--replicaof")
        return command[:at] + command[at + 3 :]
    return list(command)


class Topology:
    """What the nemesis needs of either topology."""

    kind = ""
    url_template = ""  # the gateway's redis_url, with the proxy's ports filled in

    shards = 1  # primaries there should be

    def nodes(self) -> list[RedisServer]:
        """Every data node (primaries and replicas)."""
        raise NotImplementedError

    def data_ports(self) -> list[int]:
        return [port_of(n) for n in self.nodes()]

    def other_ports(self) -> list[int]:
        return []

    def url(self, port: dict[int, int]) -> str:
        raise NotImplementedError

    def primaries(self) -> list[RedisServer]:
        raise NotImplementedError

    def replica_of(self, primary: RedisServer) -> RedisServer | None:
        raise NotImplementedError

    def healthy(self) -> bool:
        """Every primary serves and has a replica in sync (a primary kill can fail over)."""
        raise NotImplementedError

    def watch(self, primary: RedisServer) -> None:
        """Before a fault to ``primary``: note what it serves, for ``failed_over``."""

    def failed_over(self, old: RedisServer) -> int | None:
        """The port now serving in ``old``'s place, once a failover named one."""
        raise NotImplementedError

    def restart_as_replica(self, old: RedisServer, new_port: int) -> None:
        raise NotImplementedError

    def wait(self, ready: Any, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if ready():
                return True
            time.sleep(0.1)
        return False

    def role(self, server: RedisServer) -> str:
        info = _info(port_of(server))
        return "down" if info is None else str(info.get("role"))


class Sentinels(Topology):
    kind = "sentinel"

    def __init__(self, up: RedisSentinels, logs: Path) -> None:
        self.up = up
        self.logs = logs
        self.base = {port_of(s): _base(s.command or []) for s in up.servers}

    def nodes(self) -> list[RedisServer]:
        return self.up.servers

    def other_ports(self) -> list[int]:
        return [port_of(s) for s in self.up.sentinels]

    def url(self, port: dict[int, int]) -> str:
        hosts = ",".join(f"127.0.0.1:{port[p]}" for p in self.other_ports())
        return f"redis+sentinel://{hosts}/{self.up.service}"

    def primaries(self) -> list[RedisServer]:
        return [self.up.primary()]

    def replica_of(self, primary: RedisServer) -> RedisServer | None:
        return next((s for s in self.up.servers if s is not primary), None)

    def healthy(self) -> bool:
        port = self.up.primary_port()
        if port is None:
            return False
        info = _info(port)
        if info is None or info.get("role") != "master":
            return False
        if int(info.get("connected_slaves", 0)) < 1:
            return False
        replica = next(s for s in self.up.servers if port_of(s) != port)
        theirs = _info(port_of(replica))
        return bool(theirs and theirs.get("master_link_status") == "up")

    def failed_over(self, old: RedisServer) -> int | None:
        port = self.up.primary_port()
        return port if port is not None and port != port_of(old) else None

    def restart_as_replica(self, old: RedisServer, new_port: int) -> None:
        command = [*self.base[port_of(old)], "--replicaof", "127.0.0.1", str(new_port)]
        old.command = command
        old.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)


class Cluster(Topology):
    kind = "cluster"

    def __init__(self, up: RedisClusterNodes, logs: Path) -> None:
        self.up = up
        self.logs = logs
        self.watched: dict[int, int] = {}  # a primary's port -> a slot it served

    shards = 3

    def nodes(self) -> list[RedisServer]:
        return self.up.nodes

    def url(self, port: dict[int, int]) -> str:
        return f"redis+cluster://127.0.0.1:{port[port_of(self.up.nodes[0])]}"

    def primaries(self) -> list[RedisServer]:
        return [self.up.node(p) for _, _, p, _ in self.up.slots()]

    def replica_of(self, primary: RedisServer) -> RedisServer | None:
        try:
            return self.up.replica_of(primary)
        except RuntimeError:
            return None

    def healthy(self) -> bool:
        try:
            slots = self.up.slots()
        except RuntimeError:
            return False
        if len(self.up.alive()) < len(self.up.nodes) or not self.up.ok():
            return False
        for _, _, _, replicas in slots:
            if not replicas:
                return False
            info = _info(replicas[0])
            if info is None or info.get("master_link_status") != "up":
                return False
        return True

    def watch(self, primary: RedisServer) -> None:
        for first, _, port, _ in self.up.slots():
            if port == port_of(primary):
                self.watched[port] = first

    def failed_over(self, old: RedisServer) -> int | None:
        slot = self.watched.get(port_of(old))
        try:
            slots = self.up.slots()
        except RuntimeError:
            return None
        for first, last, port, _ in slots:
            if slot is not None and first <= slot <= last:
                return port if port != port_of(old) else None
        return None

    def restart_as_replica(self, old: RedisServer, new_port: int) -> None:
        # Its nodes.conf names its id and epoch: it rejoins, sees the promoted node's
        # newer epoch for its slots, and becomes that node's replica.
        assert old.command is not None
        old.process = subprocess.Popen(old.command, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def started(kind: str, down_after_ms: int, logs: Path) -> Iterator[Topology]:
    topology: Topology
    if kind == "sentinel":
        with running_sentinels(down_after_ms=down_after_ms, failover_timeout_ms=3000) as up:
            topology = Sentinels(up, logs)
            try:
                yield topology
            finally:
                continue_all()
                for server in up.servers + up.sentinels:  # restarted ones included
                    if server.process is not None and server.process.poll() is None:
                        server.process.kill()
                        server.process.wait(10)
    else:
        with running_cluster(3, replicas=1, node_timeout=down_after_ms) as nodes:
            topology = Cluster(nodes, logs)
            try:
                yield topology
            finally:
                continue_all()
                for node in nodes.nodes:
                    if node.process is not None and node.process.poll() is None:
                        node.process.kill()
                        node.process.wait(10)
