"""The workloads, each run side by side over every target in rotating order.

Rotating order cancels machine drift: in round r the targets run starting from
target r mod n, so each runs first, second, ... equally often. Every request of
a workload goes through ``bench.client``; its CPU accounting reads /proc.

Most workloads speak chat completions; ``ttft``, ``seam`` and ``protocols`` (chat
and Responses streams at one N, in alternating order within each round) also
speak the Responses API (``protocol=RESPONSES``), the Anthropic Messages API
(``protocol=MESSAGES``) and the Gemini API (``protocol=GEMINI``: the model is in the
path, so every request names it to its connection). The bench upstream speaks neither
Messages nor Gemini: their rows run against the chaos upstream, chat and the protocol
alike (``chaos_model``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import statistics
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.client import Connection, Result
from bench.procs import cpu_seconds, http_ok, machine_busy, memory_kb, tree, wait_ready
from gateway.chaos import expected_answer

CHUNKS, PACE_MS = 64, 20  # the concurrent-streams workload
STALL = 0.040  # a gap longer than this is a stall
TTFT_CHUNKS = 4  # the one-stream TTFT workload: a short answer, no pacing
NONSTREAM_CHUNKS = 16  # the non-streaming workload's answer, in tokens
MS = 1000.0
CHAT, RESPONSES, MESSAGES, GEMINI = "chat", "responses", "messages", "gemini"
PATHS = {
    CHAT: "/v1/chat/completions",
    RESPONSES: "/v1/responses",
    MESSAGES: "/v1/messages",
    GEMINI: "/v1beta/models/{model}:streamGenerateContent?alt=sse",
}
# Headers a protocol's requests carry: the chaos upstream's Gemini door wants a key (a
# gateway with no api_key on its gemini upstream passes the client's on).
HEADERS = {GEMINI: {"x-goog-api-key": "bench"}}
MAX_TOKENS = 4096  # a Messages request must say it


@dataclass
class Target:
    name: str
    port: int
    proxy: list[int] = field(default_factory=list)  # its process tree ([] for direct)
    headers: dict[str, str] = field(default_factory=dict)
    pools: dict[str, list[Connection]] = field(default_factory=dict)  # by protocol

    def connections(self, count: int, protocol: str = CHAT) -> list[Connection]:
        """``count`` keep-alive connections, the same ones from round to round."""
        pool = self.pools.setdefault(protocol, [])
        while len(pool) < count:
            headers = self.headers | HEADERS.get(protocol, {})
            pool.append(Connection("127.0.0.1", self.port, PATHS[protocol], headers))
        return pool[:count]

    @property
    def pool(self) -> list[Connection]:
        """Every connection it has opened, whatever the protocol."""
        return [c for pool in self.pools.values() for c in pool]


def gateway_targets(
    upstream: int,
    gateways: Mapping[str, subprocess.Popen[bytes]],
    ports: Mapping[str, int],
    logs: Path,
    timeout: float,
) -> list[Target]:
    """``direct`` (the upstream's port) and each of ``gateways`` once its /readyz answers
    (``SystemExit`` with the end of ``logs/NAME.log`` if it does not within ``timeout``)."""
    for name, proc in gateways.items():
        probe = http_ok(f"http://127.0.0.1:{ports[name]}/readyz")
        wait_ready(proc, probe, name, timeout=timeout, log=logs / f"{name}.log")
    targets = [Target("direct", upstream)]
    return targets + [Target(name, ports[name], tree(proc.pid)) for name, proc in gateways.items()]


@dataclass
class Roles:
    """The benchmark's processes by role, for CPU accounting."""

    upstream: list[int]
    redis: list[int]
    everything: list[int]  # every process of the benchmark, idle proxies too
    redis_port: int | None = None  # for the commands it processed (Redis ops/s)
    chaos: list[int] = field(default_factory=list)  # the chaos upstream (Messages', Gemini's)

    def redis_commands(self) -> int:
        """Commands the benchmark's redis-server processed so far (INFO stats)."""
        if self.redis_port is None:
            return 0
        import redis  # noqa: PLC0415 - only the full benchmark has a redis-server

        client = redis.Redis(port=self.redis_port)
        try:
            return int(client.info("stats")["total_commands_processed"])
        finally:
            client.close()

    def cpu(self, target: Target) -> dict[str, float]:
        roles = {
            "proxy": target.proxy,
            "upstream": self.upstream,
            "client": [os.getpid()],
            "redis": self.redis,
        }
        readings = {role: sum(map(cpu_seconds, pids)) for role, pids in roles.items()}
        readings["other"] = machine_busy() - sum(map(cpu_seconds, self.everything))
        return readings


def model(chunks: int, pace_ms: int) -> str:
    """The bench upstream's model name for an answer of ``chunks`` deltas ``pace_ms`` apart."""
    return f"bench-{chunks}x{pace_ms}ms"


MODELS = (model(TTFT_CHUNKS, 0), model(CHUNKS, PACE_MS), model(NONSTREAM_CHUNKS, 0))


def chaos_model(chunks: int, pace_ms: int) -> str:
    """The chaos upstream's model name for the same answer shape: ``chunks`` text deltas,
    every event ``pace_ms`` apart (it paces the events around the text deltas too)."""
    return f"chaos:text={chunks}" + (f",pace_ms={pace_ms}" if pace_ms else "")


def body(model: str, stream: bool, protocol: str = CHAT, **extra: Any) -> bytes:
    """A request for ``model``; a Gemini one names it (and streaming) in its path instead."""
    if protocol == GEMINI:
        return orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]} | extra)
    if protocol == RESPONSES:
        return orjson.dumps({"model": model, "input": "hi", "stream": stream} | extra)
    if protocol == MESSAGES:
        turns = [{"role": "user", "content": "hi"}]
        document = {"model": model, "max_tokens": MAX_TOKENS, "messages": turns, "stream": stream}
        return orjson.dumps(document | extra)
    return orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream} | extra
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(value: float | None) -> float | None:
    return None if value is None else value * MS


def minus(value: Any, reference: Any) -> float | None:
    """``value - reference``, or None when either was not measured."""
    if value is None or reference is None:
        return None
    return float(value) - float(reference)


def rotations(targets: Sequence[Target], rounds: int, warmup: int) -> Iterator[tuple[int, Target]]:
    """(round, target) pairs, warm-up rounds numbered below 0."""
    for r in range(-warmup, rounds):
        shift = r % len(targets)
        for target in [*targets[shift:], *targets[:shift]]:
            yield r, target


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection in the harness while it measures (it runs again after).

    A full pass over the client's heap took 18-22 ms at 512 streams: every stream
    of the round saw it as one more gap at the same moment, and a whole round of
    direct's streams counted as stalled. The gateway's own pauses still show.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def connect_all(connections: Sequence[Connection]) -> None:
    """Open connections before a timed round (keep-alive clients have them open)."""
    await asyncio.gather(*(c.connect() for c in connections))


def errors(results: Sequence[Result]) -> list[str]:
    return [r.error for r in results if r.error is not None]


def failures(errors: Sequence[str]) -> dict[str, Any]:
    """A results row's error count, with a few distinct examples."""
    return {"errors": len(errors), "error_examples": sorted(set(errors))[:3]}


# ---------------------------------------------------------------- one stream: TTFT


async def ttft(
    targets: Sequence[Target],
    requests: int,
    block: int,
    protocol: str = CHAT,
    name: str | None = None,
) -> dict[str, dict[str, Any]]:
    """``requests`` sequential streams per target, in blocks of ``block`` that rotate.

    ``name``: the model (default: the bench upstream's ``TTFT_CHUNKS`` deltas, unpaced).
    """
    asked = name or model(TTFT_CHUNKS, 0)
    payload = body(asked, True, protocol)
    samples: dict[str, list[float]] = {t.name: [] for t in targets}
    failed: dict[str, list[str]] = {t.name: [] for t in targets}
    for r, target in rotations(targets, -(-requests // block), 1):
        (connection,) = target.connections(1, protocol)
        with collector_paused():
            results = [
                await connection.request(payload, stream=True, model=asked) for _ in range(block)
            ]
        for result in results:
            result.check(TTFT_CHUNKS)
            if r < 0:
                continue
            if result.error is not None:
                failed[target.name].append(result.error)
            elif result.ttft is not None:
                samples[target.name].append(result.ttft)
    out = {}
    for name, values in samples.items():
        out[name] = {
            "n": len(values),
            "p50": ms(percentile(values, 0.5)),
            "p99": ms(percentile(values, 0.99)),
            **failures(failed[name]),
        }
    return added(out, ("p50", "p99"))


def added(table: dict[str, dict[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Add ``added_<key>``: the value minus direct's."""
    base = table.get("direct", {})
    for row in table.values():
        for key in keys:
            row[f"added_{key}"] = minus(row.get(key), base.get(key))
    return table


# ---------------------------------------------------------------- N concurrent streams


@dataclass
class Sweep:
    """Tallies of one target at one concurrency, over its counted rounds."""

    rates: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    # How late each delta arrived against the upstream's pacing, from the request: a
    # proxy that holds every event back (durability: sync) adds to all of them.
    lateness: list[float] = field(default_factory=list)
    redis_commands: int = 0
    stalled: int = 0
    streams: int = 0
    chunks: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    rss_kb: int = 0  # the proxy's largest RSS sampled mid-round

    def add(self, results: Sequence[Result], wall: float, cpu: dict[str, float]) -> None:
        chunks = sum(len(r.times) for r in results)
        self.rates.append(chunks / wall)
        self.chunks += chunks
        self.streams += len(results)
        self.wall += wall
        self.errors += errors(results)
        for r in results:
            gaps = r.gaps
            self.gaps += gaps
            self.lateness += [t - r.started - i * PACE_MS / MS for i, t in enumerate(r.times)]
            self.stalled += any(g > STALL for g in gaps)
            if r.ttft is not None:
                self.ttfts.append(r.ttft)
        for role, seconds in cpu.items():
            self.cpu[role] = self.cpu.get(role, 0.0) + seconds

    def summary(self, streams: int, rounds: int) -> dict[str, Any]:
        per_k = self.cpu.get("proxy", 0.0) * 1000 / self.chunks if self.chunks else None
        return {
            "streams": streams,
            "rounds": rounds,
            "frames_per_s": statistics.mean(self.rates) if self.rates else None,
            "gap_p50": ms(percentile(self.gaps, 0.5)),
            "gap_p99": ms(percentile(self.gaps, 0.99)),
            "stalled": self.stalled,
            "total_streams": self.streams,
            **failures(self.errors),
            "ttft_p50": ms(percentile(self.ttfts, 0.5)),
            "ttft_p99": ms(percentile(self.ttfts, 0.99)),
            "lateness_p50": ms(percentile(self.lateness, 0.5)),
            "lateness_p99": ms(percentile(self.lateness, 0.99)),
            "redis_ops_per_s": self.redis_commands / self.wall if self.wall else None,
            "cpu_s_per_1000_chunks": per_k,
            "cpu_pct": {role: 100 * s / self.wall for role, s in self.cpu.items()},
            "rss_kb": self.rss_kb or None,
        }


async def sample_rss(target: Target, after: float, into: Sweep) -> None:
    """The proxy's RSS once the round's streams are all open."""
    await asyncio.sleep(after)
    if target.proxy:
        into.rss_kb = max(into.rss_kb, sum(memory_kb(pid, "VmRSS") for pid in target.proxy))


async def streams_round(
    target: Target,
    protocol: str,
    n: int,
    roles: Roles,
    sweep: Sweep,
    counted: bool,
    name: str | None = None,
) -> None:
    """One round: ``n`` streams of ``CHUNKS`` deltas at once, tallied in ``sweep`` if counted.

    ``name``: the model (default: the bench upstream's ``CHUNKS`` deltas ``PACE_MS`` apart).
    """
    asked = name or model(CHUNKS, PACE_MS)
    payload = body(asked, True, protocol)
    connections = target.connections(n, protocol)
    await connect_all(connections)
    before, commands = roles.cpu(target), roles.redis_commands()
    rss = asyncio.create_task(sample_rss(target, CHUNKS * PACE_MS / MS / 2, sweep))
    with collector_paused():
        started = time.perf_counter()
        results = await asyncio.gather(
            *(c.request(payload, stream=True, model=asked) for c in connections)
        )
        wall = time.perf_counter() - started
    await rss
    # Less one: the INFO that read the count before is itself a command.
    after, commands = roles.cpu(target), max(0, roles.redis_commands() - commands - 1)
    for result in results:
        result.check(CHUNKS)
    if counted:
        sweep.add(results, wall, {k: after[k] - before[k] for k in after})
        sweep.redis_commands += commands


def summaries(sweeps: dict[str, Sweep], n: int, rounds: int) -> dict[str, dict[str, Any]]:
    """One row per target at ``n`` streams, with the added figures and the ratio to direct."""
    rows = added(
        {name: sweep.summary(n, rounds) for name, sweep in sweeps.items()},
        ("gap_p50", "gap_p99", "ttft_p50", "ttft_p99", "lateness_p50", "lateness_p99"),
    )
    direct = rows.get("direct", {}).get("frames_per_s")
    for row in rows.values():
        row["vs_direct"] = row["frames_per_s"] / direct if direct else None
    return rows


async def concurrency(
    targets: Sequence[Target], levels: Sequence[int], rounds: int, warmup: int, roles: Roles
) -> dict[str, dict[str, dict[str, Any]]]:
    table: dict[str, dict[str, dict[str, Any]]] = {t.name: {} for t in targets}
    for n in levels:
        sweeps = {t.name: Sweep() for t in targets}
        for r, target in rotations(targets, rounds, warmup):
            await streams_round(target, CHAT, n, roles, sweeps[target.name], r >= 0)
        for name, row in summaries(sweeps, n, rounds).items():
            table[name][str(n)] = row
    return table


def measure_concurrency(
    targets: Sequence[Target], levels: Sequence[int], rounds: int, roles: Roles
) -> dict[str, dict[str, dict[str, Any]]]:
    """``concurrency`` with one warm-up round, on uvloop, its connections closed after:
    what the side-by-side benchmarks (floor, replication, tracing) run."""

    async def measured() -> dict[str, dict[str, dict[str, Any]]]:
        table = await concurrency(targets, levels, rounds, 1, roles)
        for connection in [c for t in targets for c in t.pool]:
            await connection.close()
        return table

    return uvloop.run(measured())


async def protocols(
    targets: Sequence[Target],
    n: int,
    rounds: int,
    warmup: int,
    roles: Roles,
    other: str = RESPONSES,
    name: str | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Chat and ``other`` rounds of ``n`` streams, side by side: protocol -> target -> row.

    Within each (rotating) round a target runs one chat round and one ``other``
    round, in alternating order from round to round, so both meet the same drift.
    ``name``: the model both ask for (default: the bench upstream's, as ``streams_round``).
    """
    sweeps = {(t.name, p): Sweep() for t in targets for p in (CHAT, other)}
    for r, target in rotations(targets, rounds, warmup):
        for protocol in (CHAT, other) if r % 2 == 0 else (other, CHAT):
            sweep = sweeps[target.name, protocol]
            await streams_round(target, protocol, n, roles, sweep, r >= 0, name)
    out = {}
    for protocol in (CHAT, other):
        rows = summaries({t.name: sweeps[t.name, protocol] for t in targets}, n, rounds)
        for row in rows.values():
            row.pop("rss_kb")  # the concurrency workload measures memory
        out[protocol] = rows
    return out


def stall_free(rows: dict[str, dict[str, Any]]) -> int:
    """The largest N such that every N up to it ran with no stall and no error."""
    best = 0
    for n in sorted(rows, key=int):
        if rows[n]["stalled"] or rows[n]["errors"] or not rows[n]["total_streams"]:
            break
        best = int(n)
    return best


# ---------------------------------------------------------------- non-streaming


async def nonstream(
    targets: Sequence[Target], workers: int, each: int, rounds: int
) -> dict[str, dict[str, Any]]:
    payload = body(model(NONSTREAM_CHUNKS, 0), False)
    rates: dict[str, list[float]] = {t.name: [] for t in targets}
    latencies: dict[str, list[float]] = {t.name: [] for t in targets}
    failed: dict[str, list[str]] = {t.name: [] for t in targets}

    async def worker(connection: Connection, into: list[Result]) -> None:
        for _ in range(each):
            result = await connection.request(payload, stream=False)
            result.check(1)
            into.append(result)

    for r, target in rotations(targets, rounds, 1):
        connections = target.connections(workers)
        await connect_all(connections)
        results: list[Result] = []
        with collector_paused():
            started = time.perf_counter()
            await asyncio.gather(*(worker(c, results) for c in connections))
            wall = time.perf_counter() - started
        if r < 0:
            continue
        good = [x for x in results if x.error is None]
        rates[target.name].append(len(good) / wall)
        latencies[target.name] += [x.times[0] - x.started for x in good]
        failed[target.name] += errors(results)
    direct = statistics.mean(rates["direct"]) if rates.get("direct") else None
    out = {}
    for name, values in rates.items():
        rate = statistics.mean(values) if values else None
        out[name] = {
            "concurrency": workers,
            "requests": len(latencies[name]) + len(failed[name]),
            "req_per_s": rate,
            "vs_direct": rate / direct if rate is not None and direct else None,
            "p50": ms(percentile(latencies[name], 0.5)),
            "p99": ms(percentile(latencies[name], 0.99)),
            **failures(failed[name]),
        }
    return out


# ---------------------------------------------------------------- recoveries: seam latency


SEAM_TEXT, SEAM_AT = 40, 20


# Responses, Messages and Gemini seams take seeds from here on: ``times=1`` counts by
# the exact model string, and the chat seams of the same run use 0, 1, 2…
RESPONSES_SEEDS = 1_000_000
MESSAGES_SEEDS = 2_000_000
GEMINI_SEEDS = 3_000_000
FIRST_SEEDS = {CHAT: 0, RESPONSES: RESPONSES_SEEDS, MESSAGES: MESSAGES_SEEDS, GEMINI: GEMINI_SEEDS}


def continuation(spec: str, protocol: str) -> bytes:
    """The continuation request a recovery sends: half the answer as an assistant message.

    Messages: as the gateway continues on an anthropic upstream (prefill), the original
    turn, then the text so far as the final assistant message, trailing whitespace cut.
    Gemini: the same prefill, as a trailing ``model`` turn (one text part; the gateway
    sends the parts as the client got them, which the upstream reads as one text).
    """
    answer = expected_answer(spec).text
    if protocol == GEMINI:
        prefill = answer[: len(answer) // 2].rstrip()
        contents = [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"text": prefill}]},
        ]
        return orjson.dumps({"contents": contents})
    if protocol == MESSAGES:
        prefill = answer[: len(answer) // 2].rstrip()
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": prefill}]
        document = {"model": spec, "max_tokens": MAX_TOKENS, "messages": messages}
        return orjson.dumps(document | {"stream": True})
    turns = [
        {"role": "assistant", "content": answer[: len(answer) // 2]},
        {"role": "user", "content": "continue"},
    ]
    if protocol == RESPONSES:  # the gateway sends the original input first
        items = [{"role": "user", "content": "hi"}, *turns]
        return orjson.dumps({"model": spec, "input": items, "stream": True})
    return orjson.dumps({"model": spec, "messages": turns, "stream": True})


async def seam(
    targets: Sequence[Target], chaos: Target, recoveries: int, protocol: str = CHAT
) -> dict[str, dict[str, Any]]:
    """Fault to first spliced delta, against the continuation's TTFT sent directly.

    Each stream is 40 deltas written at once and reset (TCP RST) after the 20th;
    the gateway's route for ``chaos:*`` retries with no backoff, so the seam is
    detection + the new leg's time to first delta + the gateway's own work. After
    each recovery the same continuation request (the answer so far as an assistant
    message) goes to the chaos upstream directly: its TTFT is the baseline.
    """
    seams: dict[str, list[float]] = {t.name: [] for t in targets}
    legs: dict[str, list[float]] = {t.name: [] for t in targets}
    failed: dict[str, list[str]] = {t.name: [] for t in targets}
    (direct,) = chaos.connections(1, protocol)
    first_seed = FIRST_SEEDS[protocol]
    for i, (_, target) in enumerate(rotations(targets, recoveries, 0)):
        # A distinct seed per stream: ``times=1`` counts by the exact model string.
        spec = f"chaos:text={SEAM_TEXT},seed={first_seed + i}"
        (connection,) = target.connections(1, protocol)
        broken = f"{spec},fault=reset,at={SEAM_AT},times=1"
        result = await connection.request(body(broken, True, protocol), stream=True, model=broken)
        if result.error is None and (not result.done or len(result.times) <= SEAM_AT):
            result.error = f"did not recover: {len(result.times)} deltas"
        if result.error is not None:
            failed[target.name].append(result.error)
            continue
        seams[target.name].append(result.times[SEAM_AT] - result.times[SEAM_AT - 1])
        leg = await direct.request(continuation(spec, protocol), stream=True, model=spec)
        if leg.ttft is not None:
            legs[target.name].append(leg.ttft)
    out = {}
    for name in seams:
        row: dict[str, Any] = {
            "n": len(seams[name]),
            "p50": ms(percentile(seams[name], 0.5)),
            "p99": ms(percentile(seams[name], 0.99)),
            "leg_ttft_p50": ms(percentile(legs[name], 0.5)),
            "leg_ttft_p99": ms(percentile(legs[name], 0.99)),
            **failures(failed[name]),
        }
        for q in ("p50", "p99"):
            row[f"excess_{q}"] = minus(row[q], row[f"leg_ttft_{q}"])
        out[name] = row
    return out
