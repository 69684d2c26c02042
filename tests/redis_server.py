"""A real Redis for tests: testcontainers when a Docker engine answers, else a local
``redis-server`` on a free port (scripts/install makes sure one is installed).

Either way the test owns the server, so fault tests may stop it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
        command = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            workdir,
        ]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        server = RedisServer(f"redis://127.0.0.1:{port}/0", process, command)
        try:
            _wait_until_up(server.url)
            yield server
        finally:
            server.stop()


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


@contextlib.contextmanager
def running_redis() -> Iterator[RedisServer]:
    if _docker_answers():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7-alpine") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield RedisServer(f"redis://{host}:{port}/0", container=container)
    else:
        with _local_redis() as server:
            yield server
