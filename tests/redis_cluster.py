"""A real Redis Cluster for tests: local ``redis-server`` primaries, with replicas or not.

Each node keeps its cluster config (``nodes.conf``) in its own directory, so a node
killed with SIGKILL and started again rejoins with the same id and slots. Slots
are spread in port order: the first node serves slot 0, the last primary slot 16383.

With ``replicas=1`` (``running_cluster(replicas=1)``: 3 primaries and 3 replicas),
killing a primary makes its replica take its slots over after ``node_timeout``
and an election (about 1.5 to 3 s with the 1000 ms the failover tests use).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from redis.crc import key_slot

from tests.redis_server import RedisServer, ask, server_command
from tests.servers import free_port

BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000


def port_of(node: RedisServer) -> int:
    return int(node.url.rsplit(":", 1)[1].split("/")[0])


@dataclass
class RedisClusterNodes:
    url: str  # redis+cluster://, naming the first node
    nodes: list[RedisServer]  # primaries first (as created), then replicas

    def alive(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def slots(self) -> list[tuple[int, int, int, list[int]]]:
        """(first slot, last slot, primary's port, replicas' ports), as a live node sees it."""
        for node in self.alive():
            raw = ask(node.url, lambda c: c.cluster("SLOTS"))
            if raw is None:
                continue
            return [
                (int(r[0]), int(r[1]), int(r[2][1]), [int(replica[1]) for replica in r[3:]])
                for r in raw
            ]
        raise RuntimeError("no cluster node answers")

    def primary_of(self, key: str) -> RedisServer:
        """The node serving ``key``'s slot now (as the first live node answering sees it)."""
        slot = key_slot(key.encode())
        for first, last, port, _ in self.slots():
            if first <= slot <= last:
                return self.node(port)
        raise RuntimeError(f"slot {slot} is not served")

    def replica_of(self, primary: RedisServer) -> RedisServer:
        for _, _, port, replicas in self.slots():
            if port == port_of(primary) and replicas:
                return self.node(replicas[0])
        raise RuntimeError(f"{primary.url} has no replica")

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if port_of(n) == port)

    def ok(self) -> bool:
        """Whether every live node says cluster_state:ok."""
        return all(_cluster_ok(node.url) for node in self.alive())

    def wait_ok(self, within: float) -> None:
        deadline = time.monotonic() + within
        while not self.ok():
            assert time.monotonic() < deadline, f"the cluster is not ok after {within} s"
            time.sleep(0.05)


def _cluster_port() -> int:
    """A free port whose cluster bus port is free too."""
    while True:
        port = free_port()
        if port + BUS_OFFSET > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port


def _cluster_ok(url: str) -> bool:
    info = ask(url, lambda c: c.cluster("INFO"))
    return isinstance(info, dict) and info.get("cluster_state") == "ok"


def _replicas_synced(url: str) -> bool:
    info = ask(url, lambda c: c.info("replication"))
    if info is None:
        return False
    return bool(info.get("role") != "slave" or info.get("master_link_status") == "up")


@contextlib.contextmanager
def running_cluster(
    size: int = 3, *, replicas: int = 0, node_timeout: int = 5000, full_coverage: bool = True
) -> Iterator[RedisClusterNodes]:
    """``size`` primaries, each with ``replicas`` replicas; ``node_timeout`` in ms.

    ``full_coverage=False`` (``cluster-require-full-coverage no``): while a primary's
    slots are not served, the others go on serving theirs instead of refusing every
    key (CLUSTERDOWN) from the moment the primary is marked failed to its failover.
    """
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        raise RuntimeError("redis-server and redis-cli are not installed; run scripts/install")
    count = size * (1 + replicas)
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(_cluster_port())
    with tempfile.TemporaryDirectory() as workdir:
        nodes = []
        try:
            for port in sorted(ports):
                directory = Path(workdir) / str(port)
                directory.mkdir()
                # A replica is listed (CLUSTER SLOTS) once its offset moves, at the first
                # PING from its primary: each second (server_command), not each 10 s.
                command = server_command(
                    binary,
                    port,
                    directory,
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout),
                    "--cluster-require-full-coverage", "yes" if full_coverage else "no",
                )  # fmt: skip
                process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
                nodes.append(RedisServer(f"redis://127.0.0.1:{port}/0", process, command))
            deadline = time.monotonic() + 10
            # redis-cli makes the first ``size`` addresses the primaries.
            addresses = [f"127.0.0.1:{port}" for port in sorted(ports)]
            while True:
                created = subprocess.run(
                    [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas)]
                    + ["--cluster-yes"],
                    capture_output=True,
                    timeout=30,
                )
                if created.returncode == 0:
                    break
                if time.monotonic() > deadline:  # nodes not up yet, most likely
                    raise RuntimeError(created.stdout.decode() + created.stderr.decode())
                time.sleep(0.1)
            cluster = RedisClusterNodes(f"redis+cluster://127.0.0.1:{min(ports)}", nodes)
            cluster.wait_ok(within=20)
            while not all(_replicas_synced(node.url) for node in nodes):
                assert time.monotonic() < deadline + 20, "the replicas never synced"
                time.sleep(0.05)
            if replicas:
                # Every node must know every replica before one may be killed: a
                # replica whose primary dies before the news spread cannot be elected.
                while not all(len(s[3]) == replicas for s in cluster.slots()) or not all(
                    _knows_all(node.url, count) for node in nodes
                ):
                    assert time.monotonic() < deadline + 20, "the nodes never met"
                    time.sleep(0.05)
            yield cluster
        finally:
            for node in nodes:
                if node.process is not None and node.process.poll() is None:
                    node.stop()


def _knows_all(url: str, count: int) -> bool:
    nodes = ask(url, lambda c: c.cluster("NODES"))  # parsed: {address: fields}
    return (
        nodes is not None
        and len(nodes) == count
        and all(node["connected"] or "myself" in node["flags"] for node in nodes.values())
    )
