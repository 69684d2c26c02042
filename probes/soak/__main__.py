"""A chaos soak: many faulted streams through two replicas, every answer checked exactly.

    .venv/bin/python -m probes.soak                       # 1000 streams, concurrency 16
    .venv/bin/python -m probes.soak --streams 60 --concurrency 8 --out /tmp/soak

It starts its own processes (``probes.processes``): a redis-server on a free port,
the chaos upstream (``resumable-gateway chaos-upstream``) and two gateway
replicas (``resumable-gateway serve``) sharing that Redis. Then it runs
``--streams`` streams, ``--concurrency`` at a time, through the official openai
SDK (``probes.stream``: ``AsyncOpenAI``, ``stream=True``, ``include_usage``), each with its own
random chaos spec (``probes.soak.check.random_spec``): a text of 5-120 deltas,
sometimes tool calls and reasoning, a fault (reset, close, stall, error,
error_done, finish_error, no_finish, malformed) at a random delta, once or twice
(``times=``), sometimes cut into random byte chunks (``split=``).

While they run, the infrastructure fails: Redis is SIGKILLed and restarted on
the same port (``--redis-kill-at``: fractions of the streams done), and a
gateway replica is SIGKILLed and restarted (``--replica-kill-at``; several
fractions kill the replicas in turn). A client whose connection breaks resumes
on the other replica, as docs/durable-runs.md, "Resuming a stream", says: the same call with
``x-run-id`` (from the first response) and ``x-resume-from`` (the chunks it has),
and appends what it gets. A client that could not even connect starts afresh on
the other replica.

Each stream's assembled answer is compared with ``expected_answer(spec)``
(``probes.soak.check.classify``): exact, tool calls cut by design, ended with an
error, or defective (lost, duplicated, silently wrong, missing usage, broken
tool JSON, other contract breaks, timed out). The table goes to stdout, the
JSON report (every stream, every infrastructure event, the replicas' metrics)
and the processes' logs to ``--out``. The exit status is 1 when any stream is
defective or was never run, 2 when the infrastructure could not be restarted.

Bounded: every request has a read timeout (``--read-timeout``), every stream a
deadline (``--stream-timeout``), and no stream starts after ``--deadline``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from bench.procs import (
    commit,
    free_ports,
    machine,
    redis_ok,
    write_report,
)
from probes.processes import Process, chaos_upstream, gateway_replica
from probes.soak.check import (
    ACCEPTABLE,
    DEFECTS,
    OUTCOMES,
    classify,
    random_spec,
    spec_fault,
)
from probes.stream import ResumingStream, gateway_client

CREDENTIAL = "sk-soak"
MAX_BREAKS = 6  # per stream: connections that may break before the client gives up
STORE_DOWN_RETRY_S = 0.25  # a resume answered 503 (the store is down) is tried again after this
STORE_DOWN_RETRIES = 40  # ... this many times at most
REPLICAS = ("A", "B")
CONFIG = """
listen:
  drain_timeout: 1
upstreams:
  - name: chaos
    base_url: http://127.0.0.1:{chaos}/v1
    timeouts: {{connect: 2, first_byte: 5, idle: {idle}}}
routes:
  - match: "*"
    upstream: chaos
    retry: {{retries: 2, backoff_initial: 0.02, backoff_max: 0.1, idle_retry_delay: 0}}
state:
  redis_url: redis://127.0.0.1:{redis}/0
  checkpoint_every: 4
  lease_ttl: {lease}
  detach_grace: 30
"""
METRICS = (
    "gateway_resumes_total",
    "gateway_recoveries_total",
    "gateway_interruptions_total",
    "gateway_checkpoint_writes_total",
    "gateway_seam_trimmed_characters_total",
    "gateway_upstream_malformed_events_total",
)
LABELS = {
    "exact": "exact",
    "tools_cut": "exact text, tool calls cut by design (SynthesizeToolUse)",
    "error": "ended with an error (counted, never exact)",
    "timed_out": "timed out",
    "defective": "defective (any defect below)",
    "lost": "lost text",
    "duplicated": "duplicated text",
    "silently_wrong": "silently wrong (finished, but differs)",
    "missing_usage": "missing usage (0 or >1 usage chunks)",
    "broken_tool_json": "broken tool JSON",
    "contract": "other contract breaks",
    "not_run": "not run (deadline)",
}


def fractions(value: str) -> list[float]:
    """``0.3`` or ``0.3,0.7``; ``none`` or empty for no kill."""
    if value.strip().lower() in ("", "none"):
        return []
    out = [float(part) for part in value.split(",")]
    if not all(0 <= f <= 1 for f in out):
        raise argparse.ArgumentTypeError("fractions must be between 0 and 1")
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m probes.soak", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1, help="picks every stream's spec")
    parser.add_argument(
        "--spec",
        action="append",
        default=[],
        help="run this chaos spec instead of random ones (repeatable; to reproduce a stream)",
    )
    parser.add_argument(
        "--redis-kill-at", type=fractions, default=[0.3], help="fractions done, or none"
    )
    parser.add_argument(
        "--replica-kill-at", type=fractions, default=[0.6], help="fractions done, or none"
    )
    parser.add_argument("--redis-down-s", type=float, default=1.0)
    parser.add_argument("--replica-down-s", type=float, default=1.0)
    parser.add_argument(
        "--settle-s",
        type=float,
        default=2.0,
        help="after a restart, no other kill for this long (the gateway's checkpoint "
        "writer retries a failed store up to 2 s apart)",
    )
    parser.add_argument("--idle-timeout", type=float, default=1.0, help="the gateway's idle")
    parser.add_argument("--lease-ttl", type=int, default=1, help="the gateway's state.lease_ttl")
    parser.add_argument("--read-timeout", type=float, default=20.0, help="per request (s)")
    parser.add_argument("--stream-timeout", type=float, default=60.0, help="per stream (s)")
    parser.add_argument(
        "--deadline", type=float, help="no stream starts after this (s; default 60 + streams/2)"
    )
    parser.add_argument("--gateway-log-level", default="info")
    parser.add_argument("--out", type=Path, help="report and logs (default: a new temp dir)")
    args = parser.parse_args(argv)
    if args.spec:
        args.streams = len(args.spec)
    if args.deadline is None:
        args.deadline = 60 + args.streams / 2
    return args


def specs(args: argparse.Namespace) -> list[str]:
    if args.spec:
        return list(args.spec)
    rng = random.Random(args.seed)
    # Distinct seeds: the chaos upstream counts ``times=`` per spec string.
    seeds = rng.sample(range(1, 1 << 31), args.streams)
    return [random_spec(rng, seed) for seed in seeds]


# -- processes --------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    port: int
    process: Process
    client: AsyncOpenAI
    alive: bool = True
    generation: int = 0  # +1 at each kill: a stream that saw it change lost its replica
    streams: int = 0  # connections of streams open on it now


# -- one stream -------------------------------------------------------------------------


@dataclass
class Leg:
    """One connection of a stream: where, from which chunk, and how it ended."""

    replica: str
    kind: str  # start | resume
    resume_from: int
    end: str = ""
    replica_killed: bool = False


@dataclass
class StreamRecord:
    index: int
    spec: str
    fault: str
    outcome: str = ""
    defects: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_id: str | None = None
    error: str | None = None
    legs: list[Leg] = field(default_factory=list)
    seconds: float = 0.0
    chunks: int = 0

    @property
    def resumed_after_kill(self) -> bool:
        return any(leg.replica_killed for leg in self.legs)

    @property
    def broke_on_live_replica(self) -> bool:
        return any(
            leg.end.startswith("connection:") and not leg.replica_killed for leg in self.legs
        )


class Soak:
    def __init__(
        self, args: argparse.Namespace, specs: list[str], replicas: list[Replica], redis: Process
    ) -> None:
        self.args = args
        self.specs = specs
        self.replicas = replicas
        self.redis = redis
        self.records: list[StreamRecord | None] = [None] * len(specs)
        self.done = 0
        self.events: list[dict[str, Any]] = []
        self.infra_failed = False
        self._next = iter(range(len(specs)))
        self._turn = itertools.count()
        self._started = 0.0
        self._idle = asyncio.Event()  # set while no restart is under way
        self._idle.set()
        self._progress = asyncio.Event()  # set whenever a stream is done

    # -- the run ---------------------------------------------------------------------

    async def run(self) -> float:
        loop = asyncio.get_running_loop()
        self._started = loop.time()
        infra = asyncio.create_task(self.infrastructure())
        workers = [asyncio.create_task(self.worker()) for _ in range(self.args.concurrency)]
        await asyncio.gather(*workers)
        elapsed = loop.time() - self._started
        try:  # a restart still under way completes; a kill not reached is not made
            async with asyncio.timeout(30):
                await self._idle.wait()
        except TimeoutError:
            self.event("infrastructure still restarting at the end", failed=True)
        infra.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await infra
        return elapsed

    async def worker(self) -> None:
        loop = asyncio.get_running_loop()
        for index in self._next:
            if loop.time() - self._started > self.args.deadline:
                return
            self.records[index] = await self.stream(index, self.specs[index])
            self.done += 1
            self._progress.set()

    async def stream(self, index: int, spec: str) -> StreamRecord:
        record = StreamRecord(index, spec, spec_fault(spec))
        resumable = ResumingStream(spec)
        loop = asyncio.get_running_loop()
        started = loop.time()
        timed_out = False
        try:
            async with asyncio.timeout(self.args.stream_timeout):
                record.error = await self.drive(record, resumable)
        except TimeoutError:
            timed_out = True
        record.seconds = round(loop.time() - started, 3)
        record.run_id, record.chunks = resumable.run_id, resumable.received.chunks
        verdict = classify(spec, resumable.received, record.error, timed_out)
        record.outcome, record.defects, record.notes = (
            verdict.outcome,
            verdict.defects,
            verdict.notes,
        )
        return record

    async def drive(self, record: StreamRecord, resumable: ResumingStream) -> str | None:
        """Read the stream to its end, resuming after breaks; the error it ended with, if any."""
        previous: Replica | None = None
        breaks = unavailable = 0
        while breaks <= MAX_BREAKS:
            replica = await self.pick(avoid=previous)
            generation = replica.generation
            resuming = resumable.resuming
            leg = Leg(replica.name, "resume" if resuming else "start", resumable.received.chunks)
            record.legs.append(leg)
            replica.streams += 1
            try:
                end = await resumable.connect(replica.client)
                leg.end = end.text
                if end.kind == "connection":
                    leg.replica_killed = replica.generation != generation
                    previous = replica
                    breaks += 1
                    continue
                if end.kind == "status":
                    unavailable += 1
                    if end.status == 503 and resuming and unavailable < STORE_DOWN_RETRIES:
                        await asyncio.sleep(STORE_DOWN_RETRY_S)  # the store is down: later
                        continue
                return None if end.kind == "done" else end.text
            finally:
                replica.streams -= 1
        return f"gave up after {breaks} broken connections"

    async def pick(self, avoid: Replica | None) -> Replica:
        """The next live replica in turn, another than ``avoid`` while one is up."""
        while True:
            alive = [r for r in self.replicas if r.alive]
            others = [r for r in alive if r is not avoid]
            choice = others or alive
            if choice:
                return choice[next(self._turn) % len(choice)]
            await asyncio.sleep(0.05)

    # -- the infrastructure ------------------------------------------------------------

    def event(self, what: str, **detail: Any) -> None:
        loop = asyncio.get_running_loop()
        if detail.get("failed"):
            self.infra_failed = True
        self.events.append(
            {"t": round(loop.time() - self._started, 2), "done": self.done, "event": what} | detail
        )

    async def reached(self, fraction: float) -> None:
        while self.done < fraction * len(self.specs):
            self._progress.clear()
            await self._progress.wait()

    async def infrastructure(self) -> None:
        plan = sorted(
            [(f, "redis") for f in self.args.redis_kill_at]
            + [(f, "replica") for f in self.args.replica_kill_at]
        )
        kills, settled = 0, 0.0
        loop = asyncio.get_running_loop()
        for fraction, what in plan:
            await self.reached(fraction)
            await asyncio.sleep(settled - loop.time())
            self._idle.clear()
            if what == "redis":
                await self.bounce_redis()
            else:
                await self.bounce_replica(self.replicas[kills % len(self.replicas)])
                kills += 1
            self._idle.set()
            settled = loop.time() + self.args.settle_s

    async def bounce_redis(self) -> None:
        self.redis.kill()
        self.event("redis-server SIGKILLed", streams_open=sum(r.streams for r in self.replicas))
        await asyncio.sleep(self.args.redis_down_s)
        self.redis.spawn()
        await self.restarted(self.redis)

    async def bounce_replica(self, replica: Replica) -> None:
        replica.alive = False
        replica.generation += 1
        open_ = replica.streams
        replica.process.kill()
        self.event(f"replica {replica.name} SIGKILLed", streams_open=open_)
        await asyncio.sleep(self.args.replica_down_s)
        replica.process.spawn()
        if await self.restarted(replica.process):
            replica.alive = True

    async def restarted(self, process: Process) -> bool:
        loop = asyncio.get_running_loop()
        begun = loop.time()
        try:
            await asyncio.to_thread(process.ready, 30)
        except SystemExit as exc:  # wait_ready's way of saying it did not come up
            self.event(f"{process.name} did not restart", failed=True, why=str(exc)[:2000])
            return False
        self.event(f"{process.name} restarted", ready_after_s=round(loop.time() - begun, 2))
        return True


# -- the report -------------------------------------------------------------------------


def scrape(replicas: list[Replica]) -> dict[str, dict[str, float]]:
    """The soak's metrics, summed over the replicas (since each one's last start)."""
    out: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for replica in replicas:
        try:
            text = httpx2.get(f"http://127.0.0.1:{replica.port}/metrics", timeout=5).text
        except httpx2.HTTPError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in METRICS:
                    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    slot = out[sample.name]
                    slot[labels] = slot.get(labels, 0.0) + sample.value
    return dict(out)


def tally(records: list[StreamRecord | None]) -> dict[str, int]:
    counts = dict.fromkeys([*OUTCOMES, *DEFECTS, "not_run"], 0)
    for record in records:
        if record is None:
            counts["not_run"] += 1
            continue
        counts[record.outcome] += 1
        for defect in record.defects:
            if defect != "timed_out":
                counts[defect] += 1
    return counts


def markdown(report: dict[str, Any]) -> str:
    counts, total = report["counts"], report["meta"]["streams"]
    lines = [f"## Soak: {total} streams", "", "| outcome | streams |", "|---|---:|"]
    for key in ("exact", "tools_cut", "error", "timed_out", "defective"):
        lines.append(f"| {LABELS[key]} | {counts[key]} |")
    lines.append("| **defects** (a stream may have several) | |")
    for key in DEFECTS:
        if key != "timed_out":
            lines.append(f"| {LABELS[key]} | {counts[key]} |")
    lines.append(f"| {LABELS['not_run']} | {counts['not_run']} |")
    resumes = report["resumes"]
    lines += [
        "",
        f"Streams resumed on another replica after theirs was killed: {resumes['after_kill']} "
        f"(outcomes: {resumes['after_kill_outcomes']}); connections that broke on a live "
        f"replica (then resumed): {resumes['broke_on_live_replica']}; resumes answered 503 "
        f"(store unavailable; tried again): {resumes['answered_503']}.",
        "",
        "| fault | streams | exact | tools cut | error | timed out | defective |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for fault, row in sorted(report["by_fault"].items()):
        cells = " | ".join(str(row.get(k, 0)) for k in OUTCOMES)
        lines.append(f"| {fault} | {sum(row.values())} | {cells} |")
    lines += ["", "| t (s) | streams done | infrastructure event |", "|---:|---:|---|"]
    for event in report["infrastructure"]:
        detail = {k: v for k, v in event.items() if k not in ("t", "done", "event")}
        extra = " " + ", ".join(f"{k}={v}" for k, v in detail.items()) if detail else ""
        lines.append(f"| {event['t']} | {event['done']} | {event['event']}{extra} |")
    errors = collections.Counter(
        r["error"] for r in report["streams"] if r["outcome"] == "error" and r["error"]
    )
    if errors:
        lines += ["", "Errors the streams ended with:"]
        lines += [f"- {n} × {message}" for message, n in errors.most_common(10)]
    failures = [r for r in report["streams"] if r["outcome"] not in ACCEPTABLE]
    if failures:
        lines += ["", f"Defective streams ({len(failures)}; the first 20):"]
        for r in failures[:20]:
            lines.append(f"- #{r['index']} `{r['spec']}` {r['defects']} run {r['run_id']}")
            lines += [f"    - {note}" for note in r["notes"][:4]]
            path = ", ".join(f"{leg['kind']}@{leg['replica']}→{leg['end']}" for leg in r["legs"])
            lines.append(f"    - connections: {path}")
    meta = report["meta"]
    lines += [
        "",
        f"{meta['elapsed_s']:.1f} s of streams, {meta['runtime_s']:.1f} s in all; "
        f"`{meta['command']}`; commit {meta['commit']}.",
    ]
    return "\n".join(lines)


def build_report(
    args: argparse.Namespace,
    soak: Soak,
    metrics: dict[str, dict[str, float]],
    elapsed: float,
    started: float,
) -> dict[str, Any]:
    records = [r for r in soak.records if r is not None]
    by_fault: dict[str, dict[str, int]] = collections.defaultdict(collections.Counter)
    for r in records:
        by_fault[r.fault][r.outcome] += 1
    killed = [r for r in records if r.resumed_after_kill]
    return {
        "meta": {
            "command": "python -m probes.soak " + shlex.join(sys.argv[1:]),
            "streams": len(soak.specs),
            "concurrency": args.concurrency,
            "seed": args.seed,
            "elapsed_s": elapsed,
            "runtime_s": time.monotonic() - started,
            "commit": commit(),
            "machine": machine(),
            "config": {k: v for k, v in vars(args).items() if k not in ("out", "spec")},
        },
        "counts": tally(soak.records),
        "failed": sorted({d for r in records for d in r.defects})
        + (["not_run"] if len(records) < len(soak.specs) else []),
        "infrastructure_failed": soak.infra_failed,
        "by_fault": {k: dict(v) for k, v in by_fault.items()},
        "resumes": {
            "after_kill": len(killed),
            "after_kill_outcomes": dict(collections.Counter(r.outcome for r in killed)),
            "broke_on_live_replica": sum(r.broke_on_live_replica for r in records),
            "answered_503": sum(leg.end.startswith("HTTP 503") for r in records for leg in r.legs),
        },
        "infrastructure": soak.events,
        "metrics": metrics,
        "streams": [asdict(r) for r in records],
    }


# -- main -------------------------------------------------------------------------------


async def soak_streams(soak: Soak) -> float:
    try:
        return await soak.run()
    finally:
        for replica in soak.replicas:
            await replica.client.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found on PATH (scripts/install installs it)")
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="soak-"))
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    chosen = specs(args)
    redis_port, chaos_port, *ports = free_ports(2 + len(REPLICAS))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        redis = Process(
            "redis-server",
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "no", "--dir", tmp, "--loglevel", "warning"],
            redis_ok(redis_port),
            logs,
            stack,
        )
        chaos = chaos_upstream(chaos_port, logs, stack)
        config = logs / "gateway.yaml"
        config.write_text(
            CONFIG.format(
                chaos=chaos_port, redis=redis_port, idle=args.idle_timeout, lease=args.lease_ttl
            )
        )
        replicas = []
        for name, port in zip(REPLICAS, ports, strict=True):
            process = gateway_replica(name, config, port, args.gateway_log_level, logs, stack)
            client = gateway_client(port, CREDENTIAL, args.read_timeout)
            replicas.append(Replica(name, port, process, client))
        everything = [redis, chaos, *(r.process for r in replicas)]
        # Everything spawned before any probe: a probe's outgoing connection takes an
        # ephemeral port, which could be one a process has yet to bind.
        for process in everything:
            process.spawn()
        for process in everything:
            process.ready()
        soak = Soak(args, chosen, replicas, redis)
        elapsed = asyncio.run(soak_streams(soak))
        metrics = scrape(replicas)
    report = build_report(args, soak, metrics, elapsed, started)
    write_report(out, "soak", report, markdown(report), logs)
    if report["infrastructure_failed"]:
        return 2
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # the processes are already cleaned up
        raise SystemExit(130) from None
