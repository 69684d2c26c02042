"""The children the soak and the nemesis start, SIGKILL and start again: the chaos
upstream and gateway replicas (and the soak's redis-server), each a ``Process``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.procs import http_ok, spawned, wait_ready

BIN = Path(sys.executable).with_name("resumable-gateway")


@dataclass
class Process:
    """A child that may be SIGKILLed and started again, on the same port, with the same args."""

    name: str
    argv: list[str]
    probe: Callable[[], bool]
    logs: Path
    stack: contextlib.ExitStack
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log(self) -> Path:
        return self.logs / (
            f"{self.name}.log" if self.starts <= 1 else f"{self.name}.{self.starts}.log"
        )

    def spawn(self) -> None:
        self.starts += 1
        self.popen = self.stack.enter_context(spawned(self.argv, log=self.log))

    def ready(self, timeout: float = 60) -> None:
        assert self.popen is not None
        wait_ready(self.popen, self.probe, self.name, timeout=timeout, log=self.log)

    def kill(self) -> None:
        assert self.popen is not None
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)


def chaos_upstream(port: int, logs: Path, stack: contextlib.ExitStack) -> Process:
    """``resumable-gateway chaos-upstream`` on ``port``."""
    argv = [str(BIN), "chaos-upstream", "--port", str(port)]
    probe = http_ok(f"http://127.0.0.1:{port}/v1/models")
    return Process("chaos-upstream", argv, probe, logs, stack)


def gateway_replica(
    name: str, config: Path, port: int, log_level: str, logs: Path, stack: contextlib.ExitStack
) -> Process:
    """``resumable-gateway serve`` on ``port`` with one worker, as a pod runs it: with Redis,
    serve would start one per CPU, and a SIGKILLed parent leaves its workers serving (the
    replica would not die)."""
    argv = [str(BIN), "serve", "--config", str(config), "--port", str(port)]
    argv += ["--workers", "1", "--log-level", log_level]
    probe = http_ok(f"http://127.0.0.1:{port}/readyz")
    return Process(f"gateway-{name}", argv, probe, logs, stack)
