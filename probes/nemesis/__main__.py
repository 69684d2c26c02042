"""A nemesis of the project's own: gateway replicas on a replicated Redis, faults from a
seed, every stream judged against the fault-free answer (issue 40, item 6).

    .venv/bin/python -m probes.nemesis --profile short            # ~50 s, Sentinel (the test)
    .venv/bin/python -m probes.nemesis --topology sentinel --duration 240 --seed 1
    .venv/bin/python -m probes.nemesis --topology sentinel --actions primary_pause,gateway_kill
    .venv/bin/python -m probes.nemesis --topology cluster --duration 240 --out /tmp/nemesis

It starts its own processes: a replicated Redis (``--topology sentinel``: a primary,
one replica and three sentinels with a ``--down-after-ms`` of 1000, so a primary
paused or killed is failed over within the run; ``cluster``: 3 primaries with a
replica each, the same node timeout), the chaos upstream, and three gateway replicas
(``resumable-gateway serve``, one worker each) configured as docs/durable-runs.md
tells a careful operator: ``state.durability: sync``, ``wait_replicas: auto``, an
``owner_key``. Each replica reaches every Redis endpoint (the sentinels and the data
nodes they name, or the Cluster's nodes) through a TCP proxy of its own in this
process (``probes.nemesis.proxy``), so that the nemesis can cut one replica off.

``--concurrency`` streams at a time (12) through the openai SDK (``AsyncOpenAI``,
``stream=True``, ``include_usage``), each a random chaos spec
(``probes.soak.check.random_spec``: upstream resets, stalls, errors, … once or
twice), for ``--duration`` seconds (or ``--streams`` streams). A client drops its
connection at random points (half the streams, once or twice) and resumes on a
random replica with ``x-run-id`` + ``x-resume-from``; a client whose replica broke
or refused resumes on another one; an in-band ``run_moved`` is resumed as its
message says; a 503 on a resume is tried again.

The nemesis acts every 3-8 s (``--seed``), one action at a time, drawn from
``--actions``: ``gateway_kill`` (SIGKILL a gateway replica, restart it 1-3 s later),
``gateway_pause`` (SIGSTOP it ``--pause-s``), ``primary_kill`` (SIGKILL a Redis
primary; once a replica is promoted, start it again as that one's replica),
``primary_pause`` (SIGSTOP a primary ``--pause-s``: past the down-after it is
deposed meanwhile, and wakes up a primary until it is reconfigured),
``lagging_kill`` (SIGSTOP the primary's replica 1-3 s, SIGKILL the primary, SIGCONT
the replica), ``partition`` (one gateway replica's proxies blackholed 2-8 s). A
Redis action waits until every primary has a replica in sync first.

Each stream is judged by ``probes.soak.check.classify`` against
``gateway.chaos.expected_answer(spec)``: exact, tools cut (by design), explicit
error (with its code), silently wrong (ended cleanly, but differs: where, in the
report), damaged (an error after text that was already wrong, or another contract
break), or hung (no end within ``--stream-timeout``). The table goes to stdout; the
JSON report (every stream, every action with its time, the log lines of every
stream that went wrong) and the processes' logs to ``--out``. Exit 1 when a stream
is silently wrong, damaged or hung; 2 when the infrastructure could not be brought
back.
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from bench.procs import free_ports, machine, write_report
from gateway.chaos import parse_spec
from probes.nemesis import topology as topo
from probes.nemesis.proxy import ReplicaProxy
from probes.processes import Process, chaos_upstream, gateway_replica
from probes.soak.check import SpecChoices, classify, random_spec, spec_fault
from probes.stream import ResumingStream, gateway_client
from tests.redis_cluster import port_of
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent.parent
CREDENTIAL = "sk-nemesis"
REPLICAS = ("A", "B", "C")
ACTIONS = (
    "gateway_kill",
    "gateway_pause",
    "primary_kill",
    "primary_pause",
    "lagging_kill",
    "partition",
)
PROFILES: dict[str, dict[str, Any]] = {
    # The test's: Sentinel, about a minute, the paused primary (past the down-after)
    # twice, a replica killed, one cut off; in this order, the timings from the seed.
    "short": {
        "topology": "sentinel",
        "duration": 50.0,
        "actions": "primary_pause,gateway_kill,partition,primary_pause",
        "order": "cycle",
        "pause_s": (2.5, 5.0),
    },
    "long": {"duration": 240.0, "actions": ",".join(ACTIONS), "order": "random"},
}
# Streams long enough that faults land inside them: 20-60 ms between deltas.
CHOICES = SpecChoices(pace_ms=(20, 60))
MAX_LEGS = 16  # connections per stream before the client gives up
RETRY_503_S = 0.25
RETRIES_503 = 40
CONFIG = """
listen:
  drain_timeout: 1
upstreams:
  - name: chaos
    base_url: http://127.0.0.1:{chaos}/v1
    timeouts: {{connect: 2, first_byte: 5, idle: 1}}
routes:
  - match: "*"
    upstream: chaos
    retry: {{retries: 2, backoff_initial: 0.02, backoff_max: 0.1, idle_retry_delay: 0}}
state:
  redis_url: {url}
  durability: sync
  wait_replicas: auto
  owner_key: nemesis-owner-key-0123456789abcdef0123456789abcdef
  lease_ttl: {lease}
  detach_grace: 30
"""
CATEGORIES = ("exact", "tools_cut", "error", "silent", "damaged", "hung")
LABELS = {
    "exact": "exact (the fault-free answer, byte for byte)",
    "tools_cut": "exact text, tool calls cut by design",
    "error": "explicit error",
    "silent": "**silently wrong** (a clean end, but differs)",
    "damaged": "damaged (wrong text, then an error; or a contract break)",
    "hung": "hung (no end within the deadline)",
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m probes.nemesis", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="long")
    parser.add_argument("--topology", choices=("sentinel", "cluster"))
    parser.add_argument("--seed", type=int, default=1, help="picks the specs and the faults")
    parser.add_argument("--duration", type=float, help="seconds of streams and faults")
    parser.add_argument("--streams", type=int, default=0, help="at most this many (0: no cap)")
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--actions", help=f"comma-separated, from {', '.join(ACTIONS)}")
    parser.add_argument("--order", choices=("random", "cycle"))
    parser.add_argument("--pause-s", type=float, nargs=2, metavar=("MIN", "MAX"))
    parser.add_argument("--down-after-ms", type=int, default=1000, help="Sentinel/Cluster")
    parser.add_argument("--lease-ttl", type=float, default=2.0, help="the gateway's")
    parser.add_argument("--read-timeout", type=float, default=20.0, help="per request (s)")
    parser.add_argument("--stream-timeout", type=float, default=120.0, help="hung after (s)")
    parser.add_argument("--gateway-log-level", default="info")
    parser.add_argument("--out", type=Path, help="report and logs (default: a new temp dir)")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    args.topology = args.topology or profile.get("topology", "sentinel")
    args.duration = args.duration or profile["duration"]
    args.actions = [a.strip() for a in (args.actions or profile["actions"]).split(",") if a]
    unknown = sorted(set(args.actions) - set(ACTIONS))
    if unknown:
        parser.error(f"unknown actions: {', '.join(unknown)}")
    args.order = args.order or profile["order"]
    args.pause_s = tuple(args.pause_s or profile.get("pause_s", (1.0, 5.0)))
    return args


# -- the gateway replicas and the streams ----------------------------------------------


@dataclass
class Replica:
    name: str
    port: int
    process: Process
    proxy: ReplicaProxy
    client: AsyncOpenAI
    alive: bool = True  # false from a SIGKILL to the restart (a load balancer's view)


@dataclass
class Leg:
    replica: str
    kind: str  # start | resume
    resume_from: int
    t: float
    end: str = ""


@dataclass
class Stream:
    index: int
    spec: str
    fault: str
    drops: list[int]
    t: float = 0.0  # started, seconds into the run
    outcome: str = ""
    code: str = ""  # an explicit error's code
    error: str | None = None
    defects: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_id: str | None = None
    legs: list[Leg] = field(default_factory=list)
    seconds: float = 0.0
    chunks: int = 0
    log: list[str] = field(default_factory=list)  # the replicas' lines with its run id


def error_code(error: str) -> str:
    """``HTTP 409 resume_not_exact`` -> ``409 resume_not_exact``; in band: its code."""
    if error.startswith("HTTP "):
        return error.removeprefix("HTTP ")
    if error.startswith("error event: "):
        return "in-band " + (error.removeprefix("error event: ").split(" ", 1)[0] or "?")
    return error.split(":", 1)[0][:60]


def category(outcome: str, defects: list[str]) -> str:
    if "silently_wrong" in defects:
        return "silent"
    if outcome == "timed_out":
        return "hung"
    if outcome == "defective":
        return "damaged"
    return outcome


class Nemesis:
    def __init__(
        self, args: argparse.Namespace, topology: topo.Topology, replicas: list[Replica]
    ) -> None:
        self.args = args
        self.topology = topology
        self.replicas = replicas
        self.streams: list[Stream] = []
        self.events: list[dict[str, Any]] = []
        self.infra_failed = False
        self._spec_rng = random.Random(args.seed)
        self._seeds: set[int] = set()
        self._count = itertools.count()
        self._t0 = 0.0

    def now(self) -> float:
        return round(asyncio.get_running_loop().time() - self._t0, 2)

    def event(self, what: str, **detail: Any) -> None:
        if detail.get("failed"):
            self.infra_failed = True
        entry = {"t": self.now(), "event": what} | detail
        self.events.append(entry)
        print(f"[{entry['t']:7.2f}] {what} {detail if detail else ''}", flush=True)

    # -- the run -----------------------------------------------------------------------

    async def run(self) -> float:
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        faults = asyncio.create_task(self.nemesis())
        roles = asyncio.create_task(self.watch_roles())
        workers = [asyncio.create_task(self.worker()) for _ in range(self.args.concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in (faults, roles):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return loop.time() - self._t0

    def next_spec(self) -> str:
        while True:
            seed = self._spec_rng.randrange(1, 1 << 31)
            if seed not in self._seeds:  # the chaos upstream counts times= per spec
                self._seeds.add(seed)
                return random_spec(self._spec_rng, seed, CHOICES)

    async def worker(self) -> None:
        while self.now() < self.args.duration:
            index = next(self._count)
            if self.args.streams and index >= self.args.streams:
                return
            spec = self.next_spec()
            rng = random.Random(f"{self.args.seed}/{index}")
            deltas = parse_spec(spec).text
            drops = sorted(rng.sample(range(1, deltas + 1), rng.choice((0, 0, 1, 1, 2))))
            stream = Stream(index, spec, spec_fault(spec), drops, t=self.now())
            self.streams.append(stream)
            await self.judge(stream, rng)

    async def judge(self, stream: Stream, rng: random.Random) -> None:
        resumable = ResumingStream(stream.spec)
        loop = asyncio.get_running_loop()
        started = loop.time()
        hung = False
        try:
            async with asyncio.timeout(self.args.stream_timeout):
                stream.error = await self.drive(stream, resumable, rng)
        except TimeoutError:
            hung = True
        stream.seconds = round(loop.time() - started, 3)
        stream.run_id, stream.chunks = resumable.run_id, resumable.received.chunks
        verdict = classify(stream.spec, resumable.received, stream.error, hung)
        stream.defects, stream.notes = verdict.defects, verdict.notes
        stream.outcome = category(verdict.outcome, verdict.defects)
        if stream.outcome == "error" and stream.error:
            stream.code = error_code(stream.error)
        if stream.outcome not in ("exact", "tools_cut"):
            print(
                f"[{self.now():7.2f}] stream {stream.index} {stream.outcome} "
                f"{stream.code or stream.notes[:1]} run {stream.run_id}",
                flush=True,
            )

    def pick(self, rng: random.Random, avoid: Replica | None) -> Replica:
        alive = [r for r in self.replicas if r.alive]
        others = [r for r in alive if r is not avoid]
        return rng.choice(others or alive or self.replicas)

    async def drive(
        self, stream: Stream, resumable: ResumingStream, rng: random.Random
    ) -> str | None:
        """Read the stream to its end, dropping and resuming; the error it ended with."""
        avoid: Replica | None = None
        refused = 0
        while len(stream.legs) < MAX_LEGS:
            replica = self.pick(rng, avoid)
            kind = "resume" if resumable.resuming else "start"
            leg = Leg(replica.name, kind, resumable.received.chunks, self.now())
            stream.legs.append(leg)
            end = await resumable.connect(replica.client, drops=stream.drops)
            leg.end = end.text
            if end.kind == "done":
                return None
            if end.kind == "dropped":
                avoid = None
                await asyncio.sleep(rng.uniform(0, 0.5))
            elif end.kind == "connection":  # a read timeout too
                avoid = replica
                await asyncio.sleep(0.1)
            elif end.kind == "status" and end.status in (502, 503, 504) and refused < RETRIES_503:
                refused += 1
                avoid = replica
                await asyncio.sleep(RETRY_503_S)
            elif end.kind == "error_event" and end.code == "run_moved" and resumable.resuming:
                avoid = replica  # its message says: resume (the new owner answers)
            else:
                return end.text
        return f"gave up after {len(stream.legs)} connections"

    async def watch_roles(self) -> None:
        """Every 0.5 s, which data nodes answer ``role:master``: a report line whenever
        that set changes, so a deposed primary still answering as one shows, with its
        start and end, whatever action led to it."""
        nodes = self.topology.nodes()
        seen: list[int] | None = None
        while True:
            roles = await asyncio.to_thread(lambda: [self.topology.role(n) for n in nodes])
            masters = sorted(port_of(n) for n, r in zip(nodes, roles, strict=True) if r == "master")
            if masters != seen and seen is not None:
                split = len(masters) > self.topology.shards
                listed = " ".join(f":{p}" for p in masters) or "none"
                self.event(f"answering as primary: {listed}", split=split)
            seen = masters
            await asyncio.sleep(0.5)

    # -- the faults --------------------------------------------------------------------

    async def nemesis(self) -> None:
        rng = random.Random(f"nemesis/{self.args.seed}")
        for turn in itertools.count():
            await asyncio.sleep(rng.uniform(3, 8))
            if self.now() > self.args.duration - 3:
                return
            if self.args.order == "cycle":
                action = self.args.actions[turn % len(self.args.actions)]
            else:
                action = rng.choice(self.args.actions)
            await getattr(self, action)(rng)

    async def healthy(self) -> bool:
        if await asyncio.to_thread(self.topology.wait, self.topology.healthy, 40):
            return True
        self.event("Redis not healthy after 40 s: a Redis action skipped", failed=True)
        return False

    async def gateway_kill(self, rng: random.Random) -> None:
        replica = rng.choice([r for r in self.replicas if r.alive])
        replica.alive = False
        replica.process.kill()
        self.event(f"gateway {replica.name} SIGKILLed")
        await asyncio.sleep(rng.uniform(1, 3))
        replica.process.spawn()
        begun = asyncio.get_running_loop().time()
        try:
            await asyncio.to_thread(replica.process.ready, 30)
        except SystemExit as exc:
            self.event(f"gateway {replica.name} did not restart", failed=True, why=str(exc))
            return
        replica.alive = True
        ready = round(asyncio.get_running_loop().time() - begun, 2)
        self.event(f"gateway {replica.name} restarted", ready_after_s=ready)

    async def gateway_pause(self, rng: random.Random) -> None:
        replica = rng.choice([r for r in self.replicas if r.alive])
        seconds = round(rng.uniform(*self.args.pause_s), 2)
        assert replica.process.popen is not None
        topo.stop(replica.process.popen)
        self.event(f"gateway {replica.name} SIGSTOPped", seconds=seconds)
        await asyncio.sleep(seconds)
        topo.cont(replica.process.popen)
        self.event(f"gateway {replica.name} SIGCONTinued")

    async def partition(self, rng: random.Random) -> None:
        replica = rng.choice(self.replicas)
        seconds = round(rng.uniform(2, 8), 2)
        replica.proxy.cut()
        self.event(f"gateway {replica.name} cut off from Redis (blackhole)", seconds=seconds)
        await asyncio.sleep(seconds)
        replica.proxy.restore()
        self.event(f"gateway {replica.name} reaches Redis again")

    def _primary(self, rng: random.Random) -> RedisServer | None:
        try:
            primary = rng.choice(self.topology.primaries())
            self.topology.watch(primary)
        except (StopIteration, RuntimeError, IndexError):
            return None
        return primary

    async def primary_pause(self, rng: random.Random) -> None:
        if not await self.healthy():
            return
        primary = self._primary(rng)
        seconds = round(rng.uniform(*self.args.pause_s), 2)
        if primary is None or primary.process is None:
            return
        topo.stop(primary.process)
        self.event(f"Redis primary :{port_of(primary)} SIGSTOPped", seconds=seconds)
        await asyncio.sleep(seconds)
        topo.cont(primary.process)
        promoted = await asyncio.to_thread(self.topology.failed_over, primary)
        role = await asyncio.to_thread(self.topology.role, primary)
        self.event(
            f"Redis :{port_of(primary)} SIGCONTinued",
            role=role,
            deposed_meanwhile=promoted is not None,
            promoted=promoted,
        )
        if promoted is not None and role == "master":
            begun = asyncio.get_running_loop().time()
            await asyncio.to_thread(
                self.topology.wait, lambda: self.topology.role(primary) != "master", 30
            )
            window = round(asyncio.get_running_loop().time() - begun, 2)
            self.event(
                f"Redis :{port_of(primary)} reconfigured as a replica",
                still_primary_after_waking_s=window,
            )

    async def _failover_then_rejoin(self, primary: RedisServer, rng: random.Random) -> None:
        begun = asyncio.get_running_loop().time()
        promoted: int | None = None
        deadline = begun + 30
        while promoted is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
            promoted = await asyncio.to_thread(self.topology.failed_over, primary)
        took = round(asyncio.get_running_loop().time() - begun, 2)
        if promoted is None:
            self.event(f"no failover of :{port_of(primary)} in 30 s", failed=True)
            return
        self.event(f"Redis :{promoted} promoted", after_s=took)
        await asyncio.sleep(rng.uniform(0.5, 3))
        self.topology.restart_as_replica(primary, promoted)
        self.event(f"Redis :{port_of(primary)} restarted as a replica of :{promoted}")

    async def primary_kill(self, rng: random.Random) -> None:
        if not await self.healthy():
            return
        primary = self._primary(rng)
        if primary is None or primary.process is None:
            return
        primary.process.kill()
        primary.process.wait(10)
        self.event(f"Redis primary :{port_of(primary)} SIGKILLed")
        await self._failover_then_rejoin(primary, rng)

    async def lagging_kill(self, rng: random.Random) -> None:
        if not await self.healthy():
            return
        primary = self._primary(rng)
        if primary is None or primary.process is None:
            return
        replica = self.topology.replica_of(primary)
        if replica is None or replica.process is None:
            return
        seconds = round(rng.uniform(1, 3), 2)
        topo.stop(replica.process)
        self.event(f"Redis replica :{port_of(replica)} SIGSTOPped (lagging)", seconds=seconds)
        await asyncio.sleep(seconds)
        primary.process.kill()
        primary.process.wait(10)
        self.event(f"Redis primary :{port_of(primary)} SIGKILLed")
        await asyncio.sleep(0.3)
        topo.cont(replica.process)
        self.event(f"Redis replica :{port_of(replica)} SIGCONTinued")
        await self._failover_then_rejoin(primary, rng)


# -- the report -------------------------------------------------------------------------


def attach_logs(streams: list[Stream], logs: Path) -> None:
    """Each stream that went wrong gets the replicas' log lines naming its run."""
    wrong = {s.run_id: s for s in streams if s.outcome in ("silent", "damaged", "hung")}
    wrong.pop(None, None)
    if not wrong:
        return
    for path in sorted(logs.glob("gateway-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            for run_id, stream in wrong.items():
                if run_id and run_id in line and len(stream.log) < 200:
                    stream.log.append(f"{path.name}: {line[:600]}")


def counts(streams: list[Stream]) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": len(streams)} | dict.fromkeys(CATEGORIES, 0)
    for s in streams:
        out[s.outcome] += 1
    out["errors_by_code"] = dict(
        collections.Counter(s.code for s in streams if s.outcome == "error").most_common()
    )
    return out


def markdown(report: dict[str, Any]) -> str:
    c, meta = report["counts"], report["meta"]
    lines = [
        f"## Nemesis: {meta['topology']}, seed {meta['seed']}, {meta['duration_s']:.0f} s, "
        f"{c['streams']} streams",
        "",
        "| outcome | streams |",
        "|---|---:|",
    ]
    lines += [f"| {LABELS[k]} | {c[k]} |" for k in CATEGORIES]
    if c["errors_by_code"]:
        codes = ", ".join(f"{code} × {n}" for code, n in c["errors_by_code"].items())
        lines += ["", f"Explicit errors by code: {codes}."]
    lines += ["", "| t (s) | nemesis |", "|---:|---|"]
    for e in report["nemesis"]:
        detail = {k: v for k, v in e.items() if k not in ("t", "event")}
        extra = " " + ", ".join(f"{k}={v}" for k, v in detail.items()) if detail else ""
        lines.append(f"| {e['t']} | {e['event']}{extra} |")
    bad = [s for s in report["streams"] if s["outcome"] in ("silent", "damaged", "hung")]
    if bad:
        lines += ["", f"Streams that went wrong ({len(bad)}):"]
        for s in bad:
            lines.append(f"- #{s['index']} {s['outcome']} `{s['spec']}` run {s['run_id']}")
            lines += [f"    - {note}" for note in s["notes"][:4]]
            path = ", ".join(
                f"{leg['kind']}@{leg['replica']}[{leg['resume_from']}] t={leg['t']}→{leg['end']}"
                for leg in s["legs"]
            )
            lines.append(f"    - connections: {path}")
    lines += [
        "",
        f"`{meta['command']}`; commit {meta['commit']}; {meta['runtime_s']:.0f} s in all; "
        f"{meta['machine']}.",
    ]
    return "\n".join(lines)


def commit() -> str:
    git = ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"]
    head = subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()
    return head or "?"


# -- main -------------------------------------------------------------------------------


async def run(args: argparse.Namespace, out: Path, logs: Path) -> dict[str, Any]:
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        topology = stack.enter_context(topo.started(args.topology, args.down_after_ms, logs))
        proxies = [
            ReplicaProxy(name, topology.data_ports(), topology.other_ports()) for name in REPLICAS
        ]
        for proxy in proxies:
            await proxy.start()
        try:
            chaos_port, *ports = free_ports(1 + len(REPLICAS))
            chaos = chaos_upstream(chaos_port, logs, stack)
            replicas = []
            for name, port, proxy in zip(REPLICAS, ports, proxies, strict=True):
                config = logs / f"gateway-{name}.yaml"
                url = topology.url(proxy.port)
                config.write_text(CONFIG.format(chaos=chaos_port, url=url, lease=args.lease_ttl))
                level = args.gateway_log_level
                process = gateway_replica(name, config, port, level, logs, stack)
                client = gateway_client(port, CREDENTIAL, args.read_timeout)
                replicas.append(Replica(name, port, process, proxy, client))
            everything = [chaos, *(r.process for r in replicas)]
            for process in everything:
                process.spawn()
            for process in everything:
                await asyncio.to_thread(process.ready, 60)
            nemesis = Nemesis(args, topology, replicas)
            try:
                elapsed = await nemesis.run()
            finally:
                topo.continue_all()
                for replica in replicas:
                    await replica.client.close()
        finally:
            for proxy in proxies:
                await proxy.close()
    return {
        "meta": {
            "command": "python -m probes.nemesis " + shlex.join(sys.argv[1:]),
            "topology": args.topology,
            "seed": args.seed,
            "profile": args.profile,
            "actions": args.actions,
            "duration_s": args.duration,
            "elapsed_s": round(elapsed, 1),
            "runtime_s": time.monotonic() - started,
            "commit": commit(),
            "machine": machine(),
            "gateway_config": CONFIG.strip(),
            "config": {k: v for k, v in vars(args).items() if k != "out"},
        },
        "counts": counts(nemesis.streams),
        "infrastructure_failed": nemesis.infra_failed,
        "nemesis": nemesis.events,
        "_streams": nemesis.streams,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found on PATH (scripts/install installs it)")
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="nemesis-"))
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    async def supervised() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run(args, out, logs)

    report = asyncio.run(supervised())
    streams: list[Stream] = report.pop("_streams")
    attach_logs(streams, logs)
    report["streams"] = [asdict(s) for s in streams]
    report["logs"] = sorted(str(p) for p in logs.iterdir())
    write_report(out, "nemesis", report, markdown(report), logs)
    if report["infrastructure_failed"]:
        return 2
    c = report["counts"]
    return 1 if c["silent"] or c["hung"] or c["damaged"] else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except (KeyboardInterrupt, asyncio.CancelledError):  # the processes are cleaned up
        raise SystemExit(130) from None
