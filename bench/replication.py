"""What waiting for a Redis replica costs a sync checkpoint (issue 29).

    .venv/bin/python -m bench.replication                          # 256 and 512 streams
    .venv/bin/python -m bench.replication --streams 256 --rounds 5

A Redis primary with one replica, and two gateways on it, both with
``state.durability: sync`` (every event waits for the checkpoint holding it):

- ``sync``: ``wait_replicas: 0``, an event goes out on the primary's acknowledgement
  (the behaviour before issue 29);
- ``replicated``: ``wait_replicas: auto`` (the default), each batch of checkpoints is
  followed by a ``WAIT`` for the replica's acknowledgement.

Both run the concurrency workload of ``python -m bench`` (N streams of 64 deltas
20 ms apart, all started at once) in rotating rounds beside ``direct``, each proxy
pinned to CPU 1, the harness and both Redis processes to CPU 0. Reported per N:
frames/s and its ratio to ``sync``, the added latency per event (how late each
delta reached the client against the upstream's pacing, minus direct's) at p50
and p99, CPU per delta, TTFT p99, stalled streams, and the writes the replicated
gateway counted as replicated (``ok``) or not (``unreplicated``: WAIT timed out).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from bench import workloads
from bench.procs import free_ports, http_ok, pinned, redis_ok, spawned, wait_ready
from bench.starts import CONFIG
from bench.workloads import Roles, gateway_targets

TARGETS = ("direct", "sync", "replicated")
STATE = """state:
  redis_url: redis://127.0.0.1:{redis}/0
  wait_replicas: {wait}
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__)
    parser.add_argument("--streams", default="256,512", help="concurrency levels")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per level")
    return parser.parse_args()


def redis_server(port: int, directory: str, *extra: str) -> list[str]:
    return [
        "redis-server",
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", directory,
        "--loglevel", "warning",
        *extra,
    ]  # fmt: skip


def writes(port: int) -> dict[str, float]:
    """The gateway's ``gateway_checkpoint_writes_total`` by result."""
    text = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gateway_checkpoint_writes_total"
    }


def measure(levels: list[int], rounds: int) -> tuple[dict[str, Any], dict[str, float]]:
    os.sched_setaffinity(0, {0})
    roles_ = ("upstream", "primary", "replica", "sync", "replicated")
    ports = dict(zip(roles_, free_ports(len(roles_)), strict=True))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)

        def start(name: str, argv: list[str], cpus: str) -> subprocess.Popen[bytes]:
            return stack.enter_context(spawned(pinned(argv, cpus), None, logs / f"{name}.log"))

        py = sys.executable
        upstream = start(
            "upstream", [py, "-m", "bench.upstream", "--port", str(ports["upstream"])], "0"
        )
        redis = {}
        for name in ("primary", "replica"):
            directory = logs / name
            directory.mkdir()
            extra = ["--replicaof", "127.0.0.1", str(ports["primary"])] if name == "replica" else []
            redis[name] = start(name, redis_server(ports[name], str(directory), *extra), "0")
        for name, proc in redis.items():
            wait_ready(proc, redis_ok(ports[name]), name, log=logs / f"{name}.log")
        proxies = {}
        for name, wait in (("sync", "0"), ("replicated", "auto")):
            config = logs / f"{name}.yaml"
            state = STATE.format(redis=ports["primary"], wait=wait)
            config.write_text(CONFIG.format(port=ports["upstream"]) + state)
            argv = [py, "-m", "gateway", "serve", "--config", str(config), "--workers", "1"]
            argv += ["--port", str(ports[name]), "--log-level", "warning"]
            proxies[name] = start(name, argv, "1")
        wait_ready(upstream, http_ok(f"http://127.0.0.1:{ports['upstream']}/v1/models"), "upstream")
        targets = gateway_targets(ports["upstream"], proxies, ports, logs, timeout=60)
        roles = Roles(
            upstream=[upstream.pid],
            redis=[proc.pid for proc in redis.values()],
            everything=[os.getpid(), upstream.pid, *(p for t in targets for p in t.proxy)],
            redis_port=ports["primary"],
        )
        table = workloads.measure_concurrency(targets, levels, rounds, roles)
        return table, writes(ports["replicated"])


def markdown(
    table: dict[str, Any], levels: list[int], rounds: int, counted: dict[str, float]
) -> str:
    lines = [
        f"N streams of {workloads.CHUNKS} deltas {workloads.PACE_MS} ms apart, {rounds} rounds "
        "per target and N; latency: added to direct's, per event",
        "",
        "| N | durability sync | frames/s | × sync | latency p50 | p99 | CPU µs / delta "
        "| TTFT p99 | stalled | errors |",
        "| --: | :-- | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for n in levels:
        direct = table["direct"][str(n)]
        base = table["sync"][str(n)]["frames_per_s"]
        for name in ("sync", "replicated"):
            row = table[name][str(n)]
            label = "primary only (`wait_replicas: 0`)" if name == "sync" else "+ WAIT 1 (`auto`)"
            lines.append(
                f"| {n} | {label} | {row['frames_per_s']:.0f} | "
                f"{row['frames_per_s'] / base:.3f} | "
                f"{row['lateness_p50'] - direct['lateness_p50']:+.2f} ms | "
                f"{row['lateness_p99'] - direct['lateness_p99']:+.2f} ms | "
                f"{row['cpu_s_per_1000_chunks'] * 1000:.1f} | {row['ttft_p99']:.1f} ms | "
                f"{row['stalled']} of {row['total_streams']} | {row['errors']} |"
            )
    lines += [
        "",
        f"The replicated gateway's checkpoint writes: {counted.get('ok', 0):.0f} acknowledged "
        f"by the replica, {counted.get('unreplicated', 0):.0f} not in time (unreplicated).",
    ]
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench.replication pins the proxies and the harness to two CPUs")
    levels = [int(n) for n in args.streams.split(",")]
    table, counted = measure(levels, args.rounds)
    print(markdown(table, levels, args.rounds, counted))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
