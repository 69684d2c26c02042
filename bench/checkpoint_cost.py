"""Checkpoint cost: what checkpointing (none, in memory, Redis) costs the relay.

    .venv/bin/python -m bench.checkpoint_cost              # 100 streams, 5 rounds
    .venv/bin/python -m bench.checkpoint_cost --quick      # smoke run, a few seconds

Runs, side by side in one run, four configurations against one chaos upstream
process: ``direct`` (client -> chaos, the physical limit) and three gateway
processes, started once and all up at the same time, that differ only in
``state``: ``off`` (no checkpoints), ``memory`` and ``redis`` (a redis-server
started here on a free port, ``--save ""``). A round is N concurrent streams of
64 text deltas paced 20 ms apart; rounds alternate between the configurations
in rotating order (to cancel drift), after one uncounted warm-up round each.

Per configuration: delivered content frames/s (content deltas / round wall
time, mean over rounds), TTFT (request start -> first content delta) p50/p99,
errors, and CPU seconds per 1000 relayed chunks of the gateway process (plus
redis-server's for ``redis``), from /proc/PID/stat. A second table shows each
process's CPU utilisation during the configuration's rounds: the chaos upstream
and this client must stay below saturation for the numbers to mean anything,
and "other processes" must stay near 0% (the run warns otherwise).

The client is raw asyncio streams on uvloop, one connection per stream. With
``--client httpx`` (one pooled AsyncClient per configuration) the client was
the bottleneck on a 2-core machine: ``direct`` fell from ~4300 to ~2600 frames/s
with the client at 75% of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import uvloop

BIN = Path(sys.executable).with_name("resumable-gateway")
CONFIG = """
upstreams:
  - name: chaos
    base_url: http://127.0.0.1:{chaos}/v1
    timeouts: {{connect: 2, first_byte: 10, idle: 10}}
state:
  {state}
"""
# Quoted: an unquoted YAML `off` is the boolean false, which the config rejects.
STATES = {"off": 'store: "off"', "memory": "store: memory", "redis": "redis_url: {redis}"}
CONFIGS = ("direct", "off", "memory", "redis")
TEXT, PACE_MS = 64, 20
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_ports(count: int) -> list[int]:
    """Distinct free ports (all bound at once, so the kernel cannot hand one out twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


@contextlib.contextmanager
def spawned(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, terminated (then killed) on the way out, whatever happens."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(proc: subprocess.Popen[bytes], probe: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not probe():
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not ready after 30 s")
        time.sleep(0.05)


def http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def redis_ok(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    return probe


def machine_cpu() -> tuple[float, float]:
    """CPU seconds all cores spent, since boot, in processes (and stolen by the
    hypervisor), and in interrupts (loopback TCP is mostly softirq), from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + steal) / CLK_TCK, (irq + softirq) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat


# ---------------------------------------------------------------- the workload


@dataclass
class Stream:
    ttft: float | None = None  # seconds, request start -> first content delta
    chunks: int = 0  # content deltas received
    error: str | None = None
    started: float = field(default_factory=time.perf_counter)
    last: float = 0.0  # when the last content delta arrived

    def content(self) -> None:
        self.last = time.perf_counter()
        if self.chunks == 0:
            self.ttft = self.last - self.started
        self.chunks += 1

    @property
    def gap(self) -> float | None:
        """Mean time between content deltas (the upstream paces them PACE_MS apart)."""
        if self.ttft is None or self.chunks < 2:
            return None
        return (self.last - self.started - self.ttft) / (self.chunks - 1)


def body(seed: int) -> bytes:
    return orjson.dumps(
        {
            "model": f"chaos:text={TEXT},pace_ms={PACE_MS},seed={seed}",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        }
    )


def is_content(line: bytes) -> bool:
    """An SSE data line whose chunk carries a non-empty content delta."""
    if not line.startswith(b"data: {"):
        return False
    choices = orjson.loads(line[6:]).get("choices")
    return bool(choices and choices[0].get("delta", {}).get("content"))


async def httpx_stream(client: httpx.AsyncClient, url: str, seed: int) -> Stream:
    result = Stream()
    headers = {"content-type": "application/json"}
    async with client.stream("POST", url, content=body(seed), headers=headers) as response:
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}"
            return result
        async for line in response.aiter_lines():
            if is_content(line.encode()):
                result.content()
    return result


async def raw_stream(url: str, seed: int) -> Stream:
    """One stream over its own HTTP/1.1 connection: minimal client-side work."""
    target = httpx.URL(url)
    payload = body(seed)
    request = (
        f"POST {target.raw_path.decode()} HTTP/1.1\r\nhost: {target.host}:{target.port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + payload
    result = Stream()
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        if status != b"200":
            result.error = f"HTTP {status.decode()}"
            return result
        if b"transfer-encoding: chunked" not in head.lower():
            result.error = "response not chunked"
            return result
        pending = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            *lines, pending = (pending + data[:-2]).split(b"\n")
            for line in lines:
                if is_content(line.rstrip(b"\r")):
                    result.content()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return result


async def guarded(stream: Awaitable[Stream]) -> Stream:
    try:
        result = await stream
    except Exception as exc:  # noqa: BLE001 - a failed stream is a counted error
        return Stream(error=f"{type(exc).__name__}: {exc}")
    if result.error is None and result.chunks != TEXT:
        result.error = f"{result.chunks} of {TEXT} content deltas"
    return result


# ---------------------------------------------------------------- measuring


@dataclass
class Target:
    name: str
    url: str  # .../v1/chat/completions
    pids: dict[str, int]  # process role -> pid, for CPU accounting
    client: httpx.AsyncClient | None = None


@dataclass
class Tally:
    rates: list[float] = field(default_factory=list)  # content frames/s per round
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    chunks: int = 0
    streams: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds
    other: float = 0.0  # CPU seconds of processes not in this benchmark
    irq: float = 0.0  # CPU seconds in interrupts, all of the machine


async def run_round(target: Target, streams: int, seed: int) -> tuple[list[Stream], float]:
    def one(i: int) -> Awaitable[Stream]:
        if target.client is not None:
            return httpx_stream(target.client, target.url, seed + i)
        return raw_stream(target.url, seed + i)

    started = time.perf_counter()
    results = await asyncio.gather(*(guarded(one(i)) for i in range(streams)))
    return results, time.perf_counter() - started


async def measure(
    targets: list[Target], streams: int, rounds: int, warmup: int, ours: list[int]
) -> dict[str, Tally]:
    """``ours``: every process of this benchmark, the idle ones too."""
    tallies = {t.name: Tally() for t in targets}
    ours = [os.getpid(), *ours]
    for r in range(-warmup, rounds):
        # Rotating order: each configuration runs first, second, ... equally often.
        shift = r % len(targets)
        for target in targets[shift:] + targets[:shift]:
            pids = {"client": os.getpid(), **target.pids}
            before = {role: cpu_seconds(pid) for role, pid in pids.items()}
            busy, irq = machine_cpu()
            busy -= sum(cpu_seconds(pid) for pid in ours)
            results, wall = await run_round(target, streams, seed=(r + warmup) * streams)
            after = {role: cpu_seconds(pid) for role, pid in pids.items()}
            busy_after, irq_after = machine_cpu()
            busy = busy_after - sum(cpu_seconds(pid) for pid in ours) - busy
            if r < 0:
                continue
            tally = tallies[target.name]
            chunks = sum(s.chunks for s in results)
            tally.rates.append(chunks / wall)
            tally.ttfts.extend(s.ttft for s in results if s.ttft is not None)
            tally.gaps.extend(s.gap for s in results if s.gap is not None)
            tally.other += busy
            tally.irq += irq_after - irq
            tally.chunks += chunks
            tally.streams += len(results)
            tally.errors.extend(s.error for s in results if s.error is not None)
            tally.wall += wall
            for role in pids:
                tally.cpu[role] = tally.cpu.get(role, 0.0) + after[role] - before[role]
    return tallies


def scrape(url: str) -> list[str]:
    """The checkpoint metric samples of a gateway's /metrics."""
    text = httpx.get(url, timeout=5).text
    return [
        line
        for line in text.splitlines()
        if line.startswith(("gateway_checkpoint_writes_total", "gateway_checkpoint_write_seconds_"))
        and not line.startswith("gateway_checkpoint_write_seconds_bucket")
        and "_created" not in line
    ]


# ---------------------------------------------------------------- reporting


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def machine() -> str:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    redis = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    version = next((w[2:] for w in redis if w.startswith("v=")), "?")
    git = ["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"]
    commit = subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()
    return (
        f"machine: nproc={os.cpu_count()}, {model}, Python {platform.python_version()}, "
        f"redis-server {version}, {platform.system()} {platform.release()}; "
        f"gateway at {commit or 'unknown commit'}"
    )


def report(tallies: dict[str, Tally], streams: int, rounds: int, warmup: int, client: str) -> None:
    ms = 1000
    ideal = streams * TEXT / ((TEXT + 2) * PACE_MS / ms)
    print(
        f"{streams} concurrent streams x {TEXT} content deltas paced {PACE_MS} ms; "
        f"{rounds} counted round(s) per config (+{warmup} warm-up), rotating order; "
        f"client: {client}"
    )
    print(
        f"pace-limited ideal: {ideal:.0f} frames/s "
        f"({streams} x {TEXT} deltas per {(TEXT + 2) * PACE_MS} ms stream)\n"
    )
    base, off = tallies["direct"], tallies["off"]
    base_rate, off_rate = statistics.mean(base.rates), statistics.mean(off.rates)
    off_p50, off_p99 = statistics.median(off.ttfts) * ms, percentile(off.ttfts, 0.99) * ms
    print(
        "| config | frames/s (mean ± sd) | vs off | vs direct | TTFT p50 (ms) | TTFT p99 (ms) "
        "| Δp50 vs off | Δp99 vs off | errors | CPU s / 1000 chunks |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, t in tallies.items():
        rate = statistics.mean(t.rates)
        sd = statistics.stdev(t.rates) if len(t.rates) > 1 else 0.0
        p50 = statistics.median(t.ttfts) * ms if t.ttfts else float("nan")
        p99 = percentile(t.ttfts, 0.99) * ms if t.ttfts else float("nan")
        per_k = 1000 / t.chunks if t.chunks else float("nan")
        if name == "direct":
            cpu = "—"
        elif name == "redis":
            gw, rd = t.cpu["gateway"] * per_k, t.cpu["redis"] * per_k
            cpu = f"{gw + rd:.4f} (gateway {gw:.4f} + redis {rd:.4f})"
        else:
            cpu = f"{t.cpu['gateway'] * per_k:.4f}"
        print(
            f"| {name} | {rate:.0f} ± {sd:.0f} | {rate / off_rate:.3f} | {rate / base_rate:.3f} "
            f"| {p50:.2f} | {p99:.2f} | {p50 - off_p50:+.2f} | {p99 - off_p99:+.2f} "
            f"| {len(t.errors)} / {t.streams} | {cpu} |"
        )
    print(
        f"\nCPU utilisation during each config's rounds (% of one core; {os.cpu_count()} cores):\n"
    )
    print(
        "| config | gateway | redis-server | chaos upstream | client (this process) "
        f"| interrupts | other processes | mean gap between deltas (ms; paced {PACE_MS}) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, t in tallies.items():
        cells = [
            f"{100 * t.cpu[role] / t.wall:.0f}%" if role in t.cpu else "—"
            for role in ("gateway", "redis", "chaos", "client")
        ]
        cells.append(f"{100 * t.irq / t.wall:.0f}%")
        cells.append(f"{100 * max(t.other, 0.0) / t.wall:.0f}%")  # ticks: ±1%
        cells.append(f"{statistics.mean(t.gaps) * ms:.2f}" if t.gaps else "—")
        print(f"| {name} | {' | '.join(cells)} |")
    other = max(t.other / t.wall for t in tallies.values())
    if other > 0.1:
        print(
            f"\nWARNING: other processes used up to {100 * other:.0f}% of a core during the "
            "rounds; on this machine the numbers are noisy"
        )
    for name, t in tallies.items():
        for error in sorted(set(t.errors))[:5]:
            print(f"\n{name} error: {t.errors.count(error)} x {error}")


def print_checkpoint_metrics(name: str, samples: list[str]) -> None:
    print(f"\n`{name}` gateway /metrics (all rounds, warm-up included):\n")
    values = {}
    for sample in samples:
        key, _, value = sample.rpartition(" ")
        values[key] = float(value)
        print(f"    {sample}")
    count = values.get("gateway_checkpoint_write_seconds_count", 0.0)
    if count:
        mean = values["gateway_checkpoint_write_seconds_sum"] / count * 1000
        print(f"    -> mean batched checkpoint write: {mean:.3f} ms over {count:.0f} batches")


# ---------------------------------------------------------------- main


async def bench(
    targets: list[Target], streams: int, rounds: int, warmup: int, mode: str, ours: list[int]
) -> dict[str, Tally]:
    async with contextlib.AsyncExitStack() as stack:
        if mode == "httpx":
            for target in targets:
                limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
                target.client = await stack.enter_async_context(
                    httpx.AsyncClient(limits=limits, timeout=30)
                )
        return await measure(targets, streams, rounds, warmup, ours)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, help="concurrent streams (default 100)")
    parser.add_argument("--rounds", type=int, help="counted rounds per config (default 5)")
    parser.add_argument("--warmup", type=int, help="uncounted rounds per config (default 1)")
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="raw: asyncio streams, one connection per stream (light); httpx: one "
        "AsyncClient per config, pooled connections (default raw)",
    )
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the client's event loop (the gateway runs on uvloop; default uvloop)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 streams, 1 round")
    args = parser.parse_args()
    streams = args.streams or (10 if args.quick else 100)
    rounds = args.rounds or (1 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    # A plain `kill` cleans up too: SystemExit unwinds the context managers below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found on PATH")

    started = time.monotonic()
    roles = ("chaos", "redis-server", *CONFIGS[1:])
    ports = dict(zip(roles, free_ports(len(roles)), strict=True))
    redis_url = f"redis://127.0.0.1:{ports['redis-server']}/0"
    chaos_root = f"http://127.0.0.1:{ports['chaos']}"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        chaos = stack.enter_context(
            spawned([str(BIN), "chaos-upstream", "--port", str(ports["chaos"])])
        )
        redis = stack.enter_context(
            spawned(
                ["redis-server", "--port", str(ports["redis-server"]), "--bind", "127.0.0.1"]
                + ["--save", "", "--appendonly", "no", "--dir", tmp, "--loglevel", "warning"]
            )
        )
        gateways = {}
        for name in CONFIGS[1:]:
            config = Path(tmp, f"{name}.yaml")
            state = STATES[name].format(redis=redis_url)
            config.write_text(CONFIG.format(chaos=ports["chaos"], state=state))
            command = [str(BIN), "serve", "--config", str(config), "--port", str(ports[name])]
            gateways[name] = stack.enter_context(spawned([*command, "--log-level", "warning"]))
        # Everything spawned before any probe: a probe's outgoing connection takes an
        # ephemeral port, which could be one a process has yet to bind.
        wait_ready(redis, redis_ok(ports["redis-server"]), "redis-server")
        wait_ready(chaos, http_ok(chaos_root + "/v1/models"), "chaos upstream")
        for name, proc in gateways.items():
            wait_ready(proc, http_ok(f"http://127.0.0.1:{ports[name]}/readyz"), f"gateway {name}")
        ready = time.monotonic()

        targets = [Target("direct", chaos_root + "/v1/chat/completions", {"chaos": chaos.pid})]
        for name, proc in gateways.items():
            pids = {"gateway": proc.pid, "chaos": chaos.pid}
            if name == "redis":
                pids["redis"] = redis.pid
            url = f"http://127.0.0.1:{ports[name]}/v1/chat/completions"
            targets.append(Target(name, url, pids))
        ours = [chaos.pid, redis.pid, *(proc.pid for proc in gateways.values())]
        run = uvloop.run if args.loop == "uvloop" else asyncio.run
        tallies = run(bench(targets, streams, rounds, warmup, args.client, ours))
        samples = {
            name: scrape(f"http://127.0.0.1:{ports[name]}/metrics") for name in ("memory", "redis")
        }

    print(machine() + "\n")
    report(tallies, streams, rounds, warmup, f"{args.client} on {args.loop}")
    for name, lines in samples.items():
        print_checkpoint_metrics(name, lines)
    finished = time.monotonic()
    print(
        f"\nruntime: {finished - started:.1f} s "
        f"(start-up {ready - started:.1f} s, rounds and shutdown {finished - ready:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # the processes are already cleaned up
        raise SystemExit(130) from None
