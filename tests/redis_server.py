"""A real Redis for tests: testcontainers when a Docker engine answers, else a local
``redis-server`` on a free port (scripts/install makes sure one is installed).

Either way the test owns the server, so fault tests may stop it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

from tests.servers import free_port


@dataclass
class RedisServer:
    url: str
    process: subprocess.Popen[bytes] | None = None
    command: list[str] | None = None  # how to start it again on the same port
    container: Any = None  # testcontainers' container, when Docker runs it

    def stop(self) -> None:
        """Kill it (SIGKILL: no goodbye to clients); with Docker, freeze it."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
        elif self.container is not None:
            self.container.get_wrapped_container().pause()

    def restart(self) -> None:
        """Up again on the same address, empty (it keeps nothing on disk)."""
        if self.command is not None:
            self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL)
        elif self.container is not None:
            self.container.get_wrapped_container().unpause()
        _wait_until_up(self.url)


def _docker_answers() -> bool:
    """Whether a Docker engine accepts connections (probed without the docker library,
    whose failed probe leaves a socket open)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(2)
                sock.connect(host.removeprefix("unix://"))
        else:
            address = urlsplit(host)
            socket.create_connection((address.hostname, address.port or 2375), 2).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _local_redis() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed; run scripts/install")
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        command = server_command(binary, port, Path(workdir))
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        server = RedisServer(f"redis://127.0.0.1:{port}/0", process, command)
        try:
            _wait_until_up(server.url)
            yield server
        finally:
            server.stop()


def local_redis() -> contextlib.AbstractContextManager[RedisServer]:
    """A local ``redis-server`` even where Docker runs: one a test can restart."""
    return _local_redis()


def server_command(binary: str, port: int, directory: Path, *options: str) -> list[str]:
    """How to start a test's ``redis-server`` on ``port``, with more ``options``: loopback
    only, nothing kept on disk, a replica synced at once and pinged every second."""
    return [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(directory),
        "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not in 5 s
        "--repl-ping-replica-period", "1",
        *options,
    ]  # fmt: skip


def ask(url: str, command: Callable[[redis.Redis], Any], timeout: float = 2) -> Any:
    """``command``'s reply from the Redis at ``url``; None where it does not answer."""
    client = redis.Redis.from_url(url, socket_timeout=timeout)
    try:
        return command(client)
    except redis.RedisError:
        return None
    finally:
        client.close()


@contextlib.contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """``server`` stopped (SIGSTOP) for the block: it takes packets and answers none, as
    one behind a partition does (a replica: it stops acknowledging)."""
    process = server.process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def role(server: RedisServer) -> str | None:
    """``master`` or ``slave``, as ``server`` says; None where it does not answer."""
    info = ask(server.url, lambda c: c.info("replication"), 1)
    return None if info is None else str(info["role"])


def _wait_until_up(url: str) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    finally:
        client.close()


def redis_container() -> Any:
    """testcontainers' Redis container class, from where it lives since 4.15 (the old
    ``testcontainers.redis`` warns, and the tests turn warnings into errors)."""
    from testcontainers.community.redis import RedisContainer  # noqa: PLC0415 - Docker only

    return RedisContainer


@contextlib.contextmanager
def running_redis() -> Iterator[RedisServer]:
    """A Redis in a container where a Docker engine answers and can run one; else (no
    engine, or one that cannot pull the image: offline, no registry) a local one."""
    container = _started_container() if _docker_answers() else None
    if container is None:
        with _local_redis() as server:
            yield server
        return
    try:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        yield RedisServer(f"redis://{host}:{port}/0", container=container)
    finally:
        container.stop()


def _started_container() -> Any:
    try:
        return redis_container()("redis:7-alpine").start()
    except Exception as exc:  # noqa: BLE001 - the engine cannot run it: fall back
        print(
            f"Docker answers but cannot run redis:7-alpine ({type(exc).__name__}); "
            "using a local redis-server"
        )
        return None


@dataclass
class RedisSentinels:
    """One primary, one replica and three sentinels watching them, all local."""

    url: str  # redis+sentinel://…/SERVICE
    service: str
    servers: list[RedisServer]  # the primary as started, then its replica
    sentinels: list[RedisServer]

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel answering names it."""
        for sentinel in self.sentinels:
            address = ask(
                sentinel.url, lambda c: c.sentinel_get_master_addr_by_name(self.service), 1
            )
            if address is not None:
                return int(address[1])
        return None

    def primary(self) -> RedisServer:
        port = self.primary_port()
        return next(s for s in self.servers if s.url.endswith(f":{port}/0"))


@contextlib.contextmanager
def running_sentinels(
    *, down_after_ms: int = 1000, failover_timeout_ms: int = 3000
) -> Iterator[RedisSentinels]:
    """A primary, its replica and three sentinels (quorum 2): killing the primary fails
    it over to the replica in about ``down_after_ms`` plus one to two seconds."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed; run scripts/install")
    service = "gateway"
    with tempfile.TemporaryDirectory() as workdir:
        servers: list[RedisServer] = []
        sentinels: list[RedisServer] = []
        try:
            primary_port = free_port()
            for role in ("primary", "replica"):
                port = primary_port if role == "primary" else free_port()
                directory = Path(workdir) / str(port)
                directory.mkdir()
                command = server_command(binary, port, directory)
                if role == "replica":
                    command += ["--replicaof", "127.0.0.1", str(primary_port)]
                process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
                servers.append(RedisServer(f"redis://127.0.0.1:{port}/0", process, command))
            for server in servers:
                _wait_until_up(server.url)
            _wait_for(lambda: _replica_synced(servers[1].url), "the replica never synced")
            for _ in range(3):
                port = free_port()
                config = Path(workdir) / f"sentinel-{port}.conf"  # sentinels rewrite it
                config.write_text(
                    f"port {port}\n"
                    "bind 127.0.0.1\n"
                    f"dir {workdir}\n"
                    f"sentinel monitor {service} 127.0.0.1 {primary_port} 2\n"
                    f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
                    f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {service} 1\n"
                )
                command = [binary, str(config), "--sentinel"]
                process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
                sentinels.append(RedisServer(f"redis://127.0.0.1:{port}/0", process, command))
            for sentinel in sentinels:
                _wait_until_up(sentinel.url)
            hosts = ",".join(s.url.removeprefix("redis://").removesuffix("/0") for s in sentinels)
            up = RedisSentinels(f"redis+sentinel://{hosts}/{service}", service, servers, sentinels)
            # Each sentinel must have found the replica and the two other sentinels
            # (through the primary's hello channel) before a failover can be voted.
            _wait_for(lambda: all(_sentinel_ready(s.url, service) for s in sentinels),
                      "the sentinels never met")  # fmt: skip
            yield up
        finally:
            for server in sentinels + servers:
                if server.process is not None and server.process.poll() is None:
                    server.stop()


def _wait_for(ready: Any, message: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not ready():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def _replica_synced(url: str) -> bool:
    info = ask(url, lambda c: c.info("replication"), 1)
    return info is not None and bool(info.get("master_link_status") == "up")


def _sentinel_ready(url: str, service: str) -> bool:
    master = ask(url, lambda c: c.sentinel_master(service), 1)
    if master is None:
        return False
    if isinstance(master, list):  # a flat list of names and values
        master = dict(zip(master[::2], master[1::2], strict=True))
    fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in master.items()}
    return int(fields.get("num-slaves", 0)) >= 1 and int(fields.get("num-other-sentinels", 0)) >= 2
