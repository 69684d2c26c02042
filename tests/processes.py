"""Real gateway processes (the CLI), for tests that need signals, workers or real logs."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.servers import free_port

BIN = Path(sys.executable).with_name("resumable-gateway")
DEADLINE = 15.0  # seconds any single wait in these tests may take

# Two replicas on one Redis, in front of the chaos upstream: a short lease, no backoff.
REPLICA_CONFIG = """
upstreams:
  - name: chaos
    base_url: {chaos}
    timeouts: {{connect: 2, first_byte: 5, idle: {idle}}}{background}
routes:
  - match: "*"
    upstream: chaos
    retry: {{retries: 2, backoff_initial: 0, backoff_max: 0, idle_retry_delay: 0}}
state:
  redis_url: {redis}
  checkpoint_every: 4
  lease_ttl: 1
  detach_grace: 30
  durability: {durability}
"""


def replica_config(
    path: Path,
    chaos_url: str,
    redis_url: str,
    *,
    idle: float = 2,
    durability: str = "sync",
    state: Mapping[str, float] | None = None,
    background: bool = False,
) -> Path:
    """Write ``REPLICA_CONFIG`` for this chaos upstream and Redis to ``path``, with more
    ``state`` settings if given; ``background``: Responses asked as background responses."""
    config = REPLICA_CONFIG.format(
        chaos=chaos_url,
        redis=redis_url,
        idle=idle,
        durability=durability,
        # Written only when asked: a previous release (test_rolling_update) knows no key.
        background="\n    background: true" if background else "",
    )
    config += "".join(f"  {name}: {value}\n" for name, value in (state or {}).items())
    path.write_text(config)
    return path


def add_upstream(path: Path, name: str, kind: str, base_url: str) -> Path:
    """Add to ``replica_config``'s config at ``path`` an upstream like its one, but
    ``name`` of ``kind`` at ``base_url``, and a catch-all route to it after the first."""
    config = yaml.safe_load(path.read_text())
    (first,) = config["upstreams"]
    (route,) = config["routes"]
    config["upstreams"].append(first | {"name": name, "kind": kind, "base_url": base_url})
    config["routes"].append(route | {"upstream": name})
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Replica:
    name: str
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def freeze(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL: no last checkpoint, no goodbye to its clients, its lease left to expire."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> None:
        """SIGTERM: what Kubernetes and ``docker stop`` send; the gateway drains."""
        self.process.send_signal(signal.SIGTERM)

    def samples(self, name: str) -> list[Sample]:
        """The samples called ``name`` in a scrape of ``/metrics``."""
        text = httpx2.get(self.url + "/metrics", timeout=5).text
        return [
            sample
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def resumes(self) -> dict[tuple[str, str], float]:
        """``gateway_resumes_total`` by (kind, outcome)."""
        return {
            (s.labels["kind"], s.labels["outcome"]): s.value
            for s in self.samples("gateway_resumes_total")
        }

    def resumed(self, kind: str) -> float:
        return self.resumes().get((kind, "ok"), 0.0)


@dataclass
class Replicas:
    config: Path
    directory: Path
    started: list[Replica] = field(default_factory=list)

    def start(
        self,
        *names: str,
        args: Sequence[str] = ("--log-level", "warning"),
        env: Mapping[str, str] | None = None,
    ) -> list[Replica]:
        """Start one gateway process per name, in parallel; return them once all are ready."""
        replicas = []
        for name in names:
            port = free_port()
            log = self.directory / f"gateway-{name}.log"
            with log.open("wb") as stderr:
                # One process per replica (SIGKILL must take the whole replica), whatever
                # the workers default; ``args`` may still ask for more (the last one wins).
                process = subprocess.Popen(
                    [str(BIN), "serve", "--config", str(self.config), "--port", str(port)]
                    + ["--workers", "1", *args],
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=None if env is None else {**os.environ, **env},
                )
            replica = Replica(name, f"http://127.0.0.1:{port}", process, log)
            self.started.append(replica)
            replicas.append(replica)
        for replica in replicas:
            wait_until(functools.partial(ready, replica), f"gateway {replica.name} ready")
        return replicas

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def stop_all(self) -> None:
        for replica in self.started:
            process = replica.process
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a frozen one could not terminate
                process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            output = replica.log.read_text(errors="replace")
            if output.strip():
                print(f"--- gateway {replica.name} (exit {process.returncode}) ---\n{output}")


def ready(replica: Replica) -> bool:
    if replica.process.poll() is not None:
        output = replica.log.read_text(errors="replace")
        raise RuntimeError(f"gateway {replica.name} exited: {output}")
    try:
        return httpx2.get(replica.url + "/readyz", timeout=1).status_code == 200
    except httpx2.HTTPError:
        return False


def wait_until(condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.01)
