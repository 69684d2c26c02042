"""A real Redis Cluster for tests: three local ``redis-server`` primaries, no replicas.

Each node keeps its cluster config (``nodes.conf``) in its own directory, so a node
killed with SIGKILL and started again rejoins with the same id and slots. Slots
are spread in port order: the first node serves slot 0, the last slot 16383.
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
from typing import Any

import redis

from tests.redis_server import RedisServer
from tests.servers import free_port

BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000


@dataclass
class RedisClusterNodes:
    url: str  # redis+cluster://, naming the first node
    nodes: list[RedisServer]


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
    client = redis.Redis.from_url(url)
    try:
        info: Any = client.cluster("INFO")
    except redis.ConnectionError:
        return False
    finally:
        client.close()
    return isinstance(info, dict) and info.get("cluster_state") == "ok"


@contextlib.contextmanager
def running_cluster(size: int = 3) -> Iterator[RedisClusterNodes]:
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        raise RuntimeError("redis-server and redis-cli are not installed; run scripts/install")
    ports = sorted({_cluster_port() for _ in range(size)})
    with tempfile.TemporaryDirectory() as workdir:
        nodes = []
        try:
            for port in ports:
                directory = Path(workdir) / str(port)
                directory.mkdir()
                command = [
                    binary,
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(directory),
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "5000",
                ]  # fmt: skip
                process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
                nodes.append(RedisServer(f"redis://127.0.0.1:{port}/0", process, command))
            deadline = time.monotonic() + 10
            addresses = [f"127.0.0.1:{port}" for port in ports]
            while True:
                created = subprocess.run(
                    [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0"]
                    + ["--cluster-yes"],
                    capture_output=True,
                    timeout=30,
                )
                if created.returncode == 0:
                    break
                if time.monotonic() > deadline:  # nodes not up yet, most likely
                    raise RuntimeError(created.stdout.decode() + created.stderr.decode())
                time.sleep(0.1)
            while not all(_cluster_ok(node.url) for node in nodes):
                assert time.monotonic() < deadline + 10, "the cluster never became ok"
                time.sleep(0.05)
            yield RedisClusterNodes(f"redis+cluster://127.0.0.1:{ports[0]}", nodes)
        finally:
            for node in nodes:
                if node.process is not None and node.process.poll() is None:
                    node.stop()
