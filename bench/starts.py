"""What a request start costs the gateway: this tree side by side with another commit.

    .venv/bin/python -m bench.starts --against 74e1c6e            # CPU per request start
    .venv/bin/python -m bench.starts --against 74e1c6e --profile  # and where it goes

A request start is what the gateway does between a client's request and its
first delta: read and parse the body, route, open the upstream request, start the
client's response. The workload isolates it: rounds of ``--streams`` simultaneous
streams of 4 deltas with no pacing (the relay is a small part; the one-stream TTFT
and 256-stream rounds of ``python -m bench`` measure the rest), against the bench
upstream. Both gateways run the default config (in-memory checkpoints), one
process each pinned to CPU 1, the harness to CPU 0; the rounds alternate between
them. Reported: gateway CPU per request (its CPU seconds over the rounds divided
by the requests), and each burst's wall time and TTFT p50/p99.

``--against REV`` checks REV out into a temporary git worktree and runs its
gateway from there (``python -P``, so neither tree's code leaks into the other).
``--profile`` runs both under cProfile instead, for a second pass of the same
rounds, and prints each one's functions by cumulative time per request: the
profile before and after. cProfile slows the gateway (its CPU figures are not the
unprofiled ones); read its shares, not its microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from bench import workloads
from bench.procs import cpu_seconds, free_ports, http_ok, pinned, spawned, wait_ready, worktree
from bench.workloads import Target

ROOT = Path(__file__).resolve().parent.parent
CONFIG = """
upstreams:
  - name: bench
    base_url: http://127.0.0.1:{port}/v1
    timeouts: {{connect: 5, first_byte: 30, idle: 30}}
routes:
  - match: "*"
    upstream: bench
"""
# A gateway under cProfile that writes its stats on SIGUSR1 (run with the tree's path).
PROFILED = """
import cProfile, signal, sys, time
from gateway.cli import main
profile = cProfile.Profile(time.process_time)  # CPU time: waiting is not the request's
def dump(*_):
    profile.disable(); profile.dump_stats(sys.argv[1]); profile.enable()
signal.signal(signal.SIGUSR1, dump)
profile.enable()
main(sys.argv[2:])
"""
DELTAS = 4
# The process's outermost frame: its time is the total the shares are of.
MAIN = "cli.py"
# Frames around every request (the CLI, uvicorn's server and loop): left out of the table.
OUTER = ("cli.py", "serve.py", "main.py", "server.py", "_compat.py", "runners.py", "<built-in")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.starts", description=__doc__)
    parser.add_argument("--against", required=True, help="the commit to compare with")
    parser.add_argument("--streams", type=int, default=256, help="requests per burst")
    parser.add_argument("--rounds", type=int, default=20, help="counted bursts per gateway")
    parser.add_argument("--profile", action="store_true", help="also profile both")
    parser.add_argument("--top", type=int, default=25, help="profile rows per gateway")
    return parser.parse_args()


async def bursts(targets: list[Target], streams: int, rounds: int) -> dict[str, dict[str, Any]]:
    """``rounds`` counted bursts per target (after one warm-up), alternating."""
    payload = workloads.body(workloads.model(DELTAS, 0), True)
    cpu = {t.name: 0.0 for t in targets}
    walls: dict[str, list[float]] = {t.name: [] for t in targets}
    ttfts: dict[str, list[float]] = {t.name: [] for t in targets}
    errors = {t.name: 0 for t in targets}
    for r, target in workloads.rotations(targets, rounds, 1):
        connections = target.connections(streams)
        await workloads.connect_all(connections)
        before = sum(map(cpu_seconds, target.proxy))
        with workloads.collector_paused():
            started = time.perf_counter()
            results = await asyncio.gather(*(c.request(payload, stream=True) for c in connections))
            wall = time.perf_counter() - started
        spent = sum(map(cpu_seconds, target.proxy)) - before
        if r < 0:
            continue
        cpu[target.name] += spent
        walls[target.name].append(wall)
        for result in results:
            result.check(DELTAS)
            errors[target.name] += result.error is not None
            if result.ttft is not None:
                ttfts[target.name].append(result.ttft)
    out = {}
    for t in targets:
        requests = streams * rounds
        out[t.name] = {
            "requests": requests,
            "cpu_us_per_request": cpu[t.name] / requests * 1e6,
            "burst_ms_median": statistics.median(walls[t.name]) * 1e3,
            "ttft_p50_ms": workloads.ms(workloads.percentile(ttfts[t.name], 0.5)),
            "ttft_p99_ms": workloads.ms(workloads.percentile(ttfts[t.name], 0.99)),
            "errors": errors[t.name],
        }
    for connection in [c for t in targets for c in t.pool]:
        await connection.close()
    return out


def gateway_argv(tree: Path, config: Path, port: int, profile: Path | None) -> list[str]:
    py = [sys.executable, "-P"]
    runner = ["-c", PROFILED, str(profile)] if profile else ["-m", "gateway"]
    serve = ["serve", "--config", str(config), "--port", str(port), "--log-level", "warning"]
    return [*py, *runner, *serve]


def measure(
    trees: dict[str, Path], args: argparse.Namespace, tmp: Path, profiles: dict[str, Path] | None
) -> dict[str, dict[str, Any]]:
    upstream_port, *ports = free_ports(1 + len(trees))
    config = tmp / "gateway.yaml"
    config.write_text(CONFIG.format(port=upstream_port))
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(
            spawned(
                pinned([sys.executable, "-m", "bench.upstream", "--port", str(upstream_port)], "0"),
                None,
                tmp / "upstream.log",
            )
        )
        procs = {}
        for (name, tree), port in zip(trees.items(), ports, strict=True):
            profile = profiles[name] if profiles else None
            argv = pinned(gateway_argv(tree, config, port, profile), "1")
            env = os.environ | {"PYTHONPATH": str(tree)}
            procs[name] = stack.enter_context(spawned(argv, env, tmp / f"{name}.log"))
        wait_ready(upstream, http_ok(f"http://127.0.0.1:{upstream_port}/v1/models"), "upstream")
        for (name, proc), port in zip(procs.items(), ports, strict=True):
            probe = http_ok(f"http://127.0.0.1:{port}/readyz")
            wait_ready(proc, probe, name, timeout=120, log=tmp / f"{name}.log")
        targets = [
            Target(name, port, [proc.pid])
            for (name, proc), port in zip(procs.items(), ports, strict=True)
        ]
        results = uvloop.run(bursts(targets, args.streams, args.rounds))
        if profiles:
            for proc in procs.values():
                os.kill(proc.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while not all(p.exists() for p in profiles.values()) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1)  # the dump is written, not just begun
    return results


def profile_table(path: Path, requests: int, top: int) -> list[str]:
    """Functions by cumulative CPU time per request (µs under cProfile) and share of the
    process's CPU, the frames around every request left out."""
    stats = pstats.Stats(str(path))
    rows, total = [], 0.0
    for (file, line, name), (*_, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}({name})" if line else name
        if Path(file).name == MAIN and name == "main":
            total = cumulative
        if not any(where.startswith(outer) for outer in OUTER):
            rows.append((cumulative, where))
    rows.sort(reverse=True)
    total = total or 1.0
    lines = ["| function | µs per request (profiled) | share |", "| :-- | --: | --: |"]
    for cumulative, where in rows[:top]:
        share = 100 * cumulative / total
        lines.append(f"| `{where}` | {cumulative / requests * 1e6:.1f} | {share:.0f}% |")
    return lines


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    label = f"at {args.against}"
    with worktree(args.against) as base, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        trees = {"this tree": ROOT, label: base}
        results = measure(trees, args, tmp, None)
        print(f"\n{args.streams} simultaneous {DELTAS}-delta streams, {args.rounds} bursts each\n")
        print(
            "| gateway | requests | CPU µs per request | burst (median) | TTFT p50 | p99 | errors |"
        )
        print("| :-- | --: | --: | --: | --: | --: | --: |")
        for name, row in results.items():
            print(
                f"| {name} | {row['requests']} | {row['cpu_us_per_request']:.0f} | "
                f"{row['burst_ms_median']:.0f} ms | {row['ttft_p50_ms']:.1f} | "
                f"{row['ttft_p99_ms']:.1f} | {row['errors']} |"
            )
        ours, theirs = results["this tree"], results[label]
        if theirs["cpu_us_per_request"]:
            ratio = ours["cpu_us_per_request"] / theirs["cpu_us_per_request"]
            print(f"\nCPU per request start: {ratio:.2f}x {label}'s")
        else:  # /proc counts CPU in 10 ms ticks: a tiny run may read none
            print("\nCPU per request start: too few requests to measure")
        if args.profile:
            profiles = {name: tmp / f"{i}.prof" for i, name in enumerate(trees)}
            measure(trees, args, tmp, profiles)
            requests = args.streams * (args.rounds + 1)  # the warm-up burst is in there too
            for name, path in profiles.items():
                print(f"\nProfile, {name} (cumulative, per request):\n")
                print("\n".join(profile_table(path, requests, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
