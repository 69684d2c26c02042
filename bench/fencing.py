"""What fencing by node costs a checkpoint (issue 40): the write script with and without
its primary check, side by side on one redis-server.

    .venv/bin/python -m bench.fencing
    .venv/bin/python -m bench.fencing --runs 1,16,128 --batches 400 --rounds 5

On Sentinel every checkpoint script first asks the node that runs it for its
replication id (``INFO replication``, inside the script) and compares it with the
primary the sentinels name (``gateway.checkpoint.redis``). That is the cost measured
here: the same batches written by ``RedisStore.write`` with the check (``fenced``) and
without it (``plain``), in alternating rounds, each batch one event per run (the
cheapest write: the check's share is the largest). Reported per batch size: the
median of the rounds' mean time per batch, its difference, and that difference per
event (per run of the batch). A redis-server of its own on a free port, no replica:
what is measured is the script, not a WAIT.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time

import redis

from bench.procs import free_ports, redis_ok
from gateway.checkpoint.redis import RedisStore
from tests.durable.test_redis_topologies import Run


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fencing", description=__doc__)
    parser.add_argument("--runs", default="1,16,128", help="runs per batch (comma list)")
    parser.add_argument("--batches", type=int, default=300, help="batches per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each, alternating")
    return parser.parse_args()


async def round_of(store: RedisStore, runs: list[Run], batches: int, replid: str) -> float:
    """Seconds per batch of one round, writing every run's next event each batch."""
    started = time.perf_counter()
    for _ in range(batches):
        for run in runs:
            run.add()
        store._replicas.replid = replid  # noqa: SLF001 - as Sentinel would have set it
        await store.write([run.flush(b"key", rewrite=False) for run in runs])
        for run in runs:
            run.flushed_seq = len(run.events)
            run.record_written = True
    return (time.perf_counter() - started) / batches


async def measure(url: str, sizes: list[int], batches: int, rounds: int) -> None:
    replid = str(redis.Redis.from_url(url).info("replication")["master_replid"])
    store = RedisStore(url)
    print("| runs per batch | plain µs/batch | fenced µs/batch | difference | per event |")
    print("|--:|--:|--:|--:|--:|")
    try:
        for size in sizes:
            times: dict[str, list[float]] = {"plain": [], "fenced": []}
            for number in range(rounds):
                for label, check in (("plain", ""), ("fenced", replid)):
                    runs = [Run(f"{label}-{size}-{number}-{i}") for i in range(size)]
                    times[label].append(await round_of(store, runs, batches, check))
            plain = statistics.median(times["plain"]) * 1e6
            fenced = statistics.median(times["fenced"]) * 1e6
            extra = fenced - plain
            print(
                f"| {size} | {plain:.1f} | {fenced:.1f} | {extra:+.1f} µs "
                f"({fenced / plain:.2f}×) | {extra / size:+.2f} µs |"
            )
    finally:
        await store.aclose()


def main() -> None:
    args = parse_args()
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory() as directory:
        command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", directory]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while not redis_ok(port)():
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.05)
            sizes = [int(size) for size in args.runs.split(",")]
            url = f"redis://127.0.0.1:{port}/0"
            asyncio.run(measure(url, sizes, args.batches, args.rounds))
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
