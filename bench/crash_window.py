"""The crash window: events a client holds that the checkpoint store does not (yet).

    .venv/bin/python -m bench.crash_window --streams 100

If a replica dies, a resumer continues from the last checkpoint; whatever the
client received after it is the window in which a sampling model's text may be
regenerated differently (docs/durable-runs.md). This runs the gateway
in-process against its own ``redis-server`` and the chaos upstream, streams
``--streams`` concurrent answers (64 deltas, 20 ms apart), and samples every
millisecond, for every running run, ``events released to clients − events
durable`` — the window a SIGKILL at that instant would open. It does so for
``durability: sync`` (the default: group commit) and ``async`` with
``checkpoint_every`` 4 and 1, side by side, and reports the distribution with
the number of checkpoint writes each setting costs.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import uvicorn

from gateway.app import create_app
from gateway.config.load import parse_config
from gateway.context import Gateway
from gateway.metrics import Metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (scripts/install installs it)")
    port = _free_port()
    with tempfile.TemporaryDirectory() as workdir:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.kill()
            process.wait()


@contextmanager
def chaos_upstream() -> Iterator[str]:
    port = _free_port()
    binary = Path(sys.executable).with_name("resumable-gateway")
    process = subprocess.Popen(
        [str(binary), "chaos-upstream", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.kill()
        process.wait()


@contextmanager
def gateway(
    chaos_url: str, redis_url: str, mode: str, every: int
) -> Iterator[tuple[str, Any, Metrics]]:
    config = parse_config(
        {
            "upstreams": [{"name": "chaos", "base_url": chaos_url}],
            "state": {"redis_url": redis_url, "checkpoint_every": every, "durability": mode},
        }
    )
    metrics = Metrics()
    app = create_app(config, metrics)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, port=port, loop="uvloop", log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1", app, metrics
    finally:
        server.should_exit = True
        thread.join(10)


async def _stream(client: httpx2.AsyncClient, base: str, seed: int) -> int:
    body = {"model": f"chaos:text=64,pace_ms=20,seed={seed}", "messages": [], "stream": True}
    events = 0
    async with client.stream("POST", base + "/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            events += line.startswith("data: ")
    return events


def measure(chaos_url: str, redis_url: str, mode: str, every: int, streams: int) -> dict[str, Any]:
    windows: list[int] = []
    with gateway(chaos_url, redis_url, mode, every) as (base, app, metrics):
        runs = app.state.gateway.runs
        assert isinstance(app.state.gateway, Gateway)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for local in list(runs.local.values()):
                    if local.status == "running" and local.log.events:
                        # What its clients may hold (released) beyond the store.
                        windows.append(max(0, local.log.visible - local.durable_events))
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # The clients run in their own process, so that only the gateway (and this
        # sampler, which sleeps most of the time) shares this one's GIL.
        started = time.perf_counter()
        client = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.crash_window",
                "--client",
                base,
                "--streams",
                str(streams),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        received = [int(n) for n in client.stdout.split()]
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
        writes = metrics.registry.get_sample_value(
            "gateway_checkpoint_writes_total", {"result": "ok"}
        )
        batches = metrics.registry.get_sample_value("gateway_checkpoint_write_seconds_count")
        total = metrics.registry.get_sample_value("gateway_checkpoint_write_seconds_sum")
        mean_write = 1000 * (total or 0) / max(batches or 0, 1)
    windows.sort()
    return {
        "mode": mode,
        "every": every,
        "samples": len(windows),
        "p50": statistics.median(windows),
        "p99": windows[int(len(windows) * 0.99)],
        "max": windows[-1],
        "writes_per_stream": (writes or 0) / streams,
        "write_ms": mean_write,
        "events": sum(received),
        "seconds": elapsed,
    }


def clients(base: str, streams: int) -> None:
    async def go() -> list[int]:
        limits = httpx2.Limits(max_connections=streams + 8)
        async with httpx2.AsyncClient(limits=limits, timeout=60) as client:
            return await asyncio.gather(*(_stream(client, base, s) for s in range(streams)))

    print(" ".join(map(str, asyncio.run(go()))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: the load process
    args = parser.parse_args()
    if args.client:
        clients(args.client, args.streams)
        return
    modes = (("sync", 4), ("async", 4), ("async", 1))
    results: dict[tuple[str, int], list[dict[str, Any]]] = {mode: [] for mode in modes}
    with chaos_upstream() as chaos_url, redis_server() as redis_url:
        for _ in range(args.rounds):
            for mode, every in modes:  # alternated, so drift hits all
                result = measure(chaos_url, redis_url, mode, every, args.streams)
                results[mode, every].append(result)
    print(
        f"{args.streams} concurrent streams x 64 deltas, 20 ms apart; {args.rounds} rounds each\n"
    )
    print(
        "| durability | checkpoint_every | window p50 (events) | p99 | max | writes/stream "
        "| write ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for (mode, every), rounds in results.items():
        print(
            f"| {mode} | {every} | {statistics.median(r['p50'] for r in rounds):g} "
            f"| {max(r['p99'] for r in rounds)} | {max(r['max'] for r in rounds)} "
            f"| {statistics.mean(r['writes_per_stream'] for r in rounds):.1f} "
            f"| {statistics.mean(r['write_ms'] for r in rounds):.1f} |"
        )


if __name__ == "__main__":
    main()
