"""What every abuse probe works with: the processes under test, the sizes, one probe's result."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import orjson

from bench.procs import free_ports, http_ok, spawned, wait_ready
from probes.abuse.net import Meter, RawUpstream, Victim, rss_kb

BIN = Path(sys.executable).with_name("resumable-gateway")

SECRET = "sk-abuse-7d1e5b2a40688f1d2c3b4a5e6f70c9e1"  # the upstreams' api_key
CLIENT_KEY = "sk-client-abuse"  # what clients send (the gateway has no keys of its own)
MB = 1024 * 1024


@dataclass(frozen=True)
class Sizes:
    huge_line: int  # probe 2: one SSE line without an end
    huge_line_runs: int
    flood_clients: int  # probe 3
    flood_bytes: int
    flood_pause_s: float
    big_header: int  # probe 5
    slow_heads: int  # probe 6
    slow_bodies: int
    silent: int
    big_body: int  # probe 9

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        if quick:
            return cls(20 * MB, 5, 2, 40 * MB, 3.0, 5 * MB, 50, 20, 100, 20 * MB)
        return cls(200 * MB, 5, 4, 50 * MB, 10.0, 100 * MB, 500, 200, 1500, 20 * MB)


@dataclass(frozen=True)
class Limits:
    """The gateway settings the probes' expectations derive from (the config sets them)."""

    header_timeout: float = 2.0
    body_timeout: float = 2.0
    linger: float = 2.0  # gateway.listen.LINGER: a refused connection is read this long
    max_event_bytes: int = 8 * MB  # limits.max_event_bytes (default)
    max_body_bytes: int = 16 * MB  # limits.max_body_bytes (default)
    # Longer than a probe's unread pause: a client is waited for (back-pressure) this long.
    detach_grace: float = 12.0


@dataclass
class Gateway:
    name: str
    port: int
    pid: int
    log: Path
    base_path: str  # the configured upstream base URL's path ("" or "/v1")
    upstream: str  # "chaos" or "raw": where its pass-through requests go

    def alive(self) -> bool:
        try:
            return httpx2.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5).status_code == 200
        except httpx2.HTTPError:
            return False

    def log_lines(self, offset: int = 0) -> list[dict[str, Any]]:
        """The gateway's JSON log lines from byte ``offset`` on."""
        with self.log.open("rb") as f:
            f.seek(offset)
            text = f.read()
        lines = []
        for line in text.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(line)
                if isinstance(parsed, dict):
                    lines.append(parsed)
        return lines

    def log_size(self) -> int:
        return self.log.stat().st_size


KINDS = {"main": ("/v1", "chaos"), "nopath": ("", "raw")}  # base path, pass-through upstream


@dataclass
class Lab:
    """The processes every probe shares, and fresh gateways on demand.

    Each probe gets a gateway of its own (``gateway``), started for it and stopped
    after it: a process that already grew and freed its heap would hide a later
    probe's growth (freed memory is reused before RSS grows), and its descriptors
    and pooled connections would blur the next probe's counts.
    """

    quick: bool
    sizes: Sizes
    limits: Limits
    configs: dict[str, Path]  # "main": base URLs .../v1; "nopath": a base URL without a path
    env: dict[str, str]
    chaos_port: int
    chaos_pid: int
    chaos_idle_sockets: set[str]  # the chaos process's sockets with no client connected
    raw: RawUpstream
    victim: Victim
    logs: Path
    started: list[Gateway] = field(default_factory=list)

    @contextlib.contextmanager
    def gateway(self, kind: str, label: str) -> Iterator[Gateway]:
        """A gateway (``resumable-gateway serve``) with the ``kind`` config, until the end."""
        (port,) = free_ports(1)
        log = self.logs / f"gateway-{label}.log"
        argv = [str(BIN), "serve", "--config", str(self.configs[kind]), "--port", str(port)]
        with spawned(argv, env=self.env, log=log) as proc:
            try:
                ready = http_ok(f"http://127.0.0.1:{port}/readyz")
                wait_ready(proc, ready, f"gateway {label}", timeout=30, log=log)
            except SystemExit as exc:  # wait_ready's way to say it did not come up
                raise RuntimeError(str(exc)) from None
            base_path, upstream = KINDS[kind]
            gateway = Gateway(label, port, proc.pid, log, base_path, upstream)
            self.started.append(gateway)
            yield gateway

    def chaos_requests(self) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.chaos_port}/_chaos/requests"
        recorded = orjson.loads(httpx2.get(url, timeout=10).content)
        assert isinstance(recorded, list)
        return recorded


@dataclass
class ProbeResult:
    number: str
    name: str
    sent: str
    expectation: str
    gateway: str = "main"
    outcome: str = ""  # what the client saw, in short
    failures: list[str] = field(default_factory=list)
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float = 0.0
    fds_before: int = 0
    fds_after: int = 0
    upstream_requests: int = 0
    upstream_bytes: int | None = None  # response bytes the upstream managed to write
    victim_contacts: int = 0
    secret_leaked: bool = False  # the upstream key reached the victim, a client or a log
    gateway_alive: bool = True
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    def check(self, ok: bool, failure: str) -> bool:
        if not ok:
            self.failures.append(failure)
        return ok

    def measured(self, meter: Meter) -> None:
        self.rss_before_mb = round(meter.rss_before / 1024, 1)
        self.rss_peak_mb = round(meter.rss_peak / 1024, 1)
        self.rss_after_mb = round(meter.rss_after / 1024, 1)
        self.fds_before, self.fds_after = meter.fds_before, meter.fds_after

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items()}
        out["passed"] = self.passed
        return out


@contextlib.contextmanager
def observed(
    lab: Lab, result: ProbeResult, gateway: Gateway, settle: float = 1.0
) -> Iterator[Meter]:
    """Meter ``gateway`` around a probe, count what reached the upstreams and the victim,
    and check the gateway survived. ``meter.settle`` may be called inside, earlier."""
    result.gateway = gateway.name
    chaos_mark = len(lab.chaos_requests())
    raw_mark, victim_mark = lab.raw.mark(), lab.victim.mark()
    started = time.monotonic()
    with Meter(gateway.pid) as meter:
        yield meter
        if not meter.rss_after:
            meter.settle(settle)
    result.seconds = round(time.monotonic() - started, 2)
    result.measured(meter)
    chaos_new = lab.chaos_requests()[chaos_mark:]
    raw_new = lab.raw.since(raw_mark)
    result.upstream_requests = len(chaos_new) + len(raw_new)
    contacts = lab.victim.since(victim_mark)
    result.victim_contacts = len(contacts)
    if any(SECRET.encode() in c.data for c in contacts):
        result.secret_leaked = True
    result.details.setdefault("upstream_paths", [r["path"] for r in chaos_new][:50])
    result.details["raw_upstream_paths"] = [r.path for r in raw_new][:50]
    result.gateway_alive = gateway.alive() and rss_kb(gateway.pid) > 0
    result.check(result.gateway_alive, "the gateway is not up after the probe")
    result.check(result.victim_contacts == 0, f"the victim was contacted {len(contacts)} times")
    result.check(not result.secret_leaked, "the upstream key reached the victim or a client")
