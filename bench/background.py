"""Responses streams as background responses against today's relay (issue 47).

    .venv/bin/python -m bench.background                 # 10 rounds of 20 streams each way
    .venv/bin/python -m bench.background --rounds 3 --streams 5
    .venv/bin/python -m bench.background --against REV   # and REV's relay beside them

One chaos upstream (the real CLI) and two gateways in front of it, in one run, the same
config but for the upstream's ``background``: ``foreground`` (``false``: today's
Responses relay) and ``background`` (``true``: every stored request asked as a
background response, shown to the client as the one it asked for, its later events
renumbered in place). A round is N Responses streams through each, alternating which
goes first. ``--against REV`` adds a third gateway, REV's own (checked out into a
temporary worktree, run with ``python -P``), in the foreground: the relay as it was.
Two workloads:

- **unbroken**: a 512-delta answer, nothing cut: the relay's own cost per delta, the
  figure the issue holds the background path to (no higher than today's);
- **cut**: the same answer, its connection reset half-way: the foreground gateway
  continues it (a second generation, in prompt mode), the background one reads the
  same response again from where it broke (``Reattach``). Per stream: the gateway's
  CPU, the upstream's requests, and the output tokens the upstream generated.

The gateways' CPU comes from their processes' ``/proc`` stat; reported per delta the
client received, with the ratios background ÷ foreground (and ÷ REV).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx2

from bench.procs import (
    commit,
    cpu_seconds,
    free_ports,
    http_ok,
    machine,
    spawned,
    wait_ready,
    worktree,
)

BIN = Path(sys.executable).with_name("resumable-gateway")
ROOT = Path(__file__).resolve().parent.parent
DELTAS = 512
CONFIG = """
upstreams:
  - name: chaos
    base_url: http://127.0.0.1:{port}/v1
    timeouts: {{connect: 5, first_byte: 30, idle: 30}}
    continuation: prompt{background}
routes:
  - match: "*"
    upstream: chaos
    retry: {{retries: 2, backoff_initial: 0, backoff_max: 0}}
"""
FOREGROUND, BACKGROUND = "foreground", "background"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.background", description=__doc__)
    parser.add_argument("--rounds", type=int, default=10, help="rounds of streams each way")
    parser.add_argument("--streams", type=int, default=20, help="streams per round and way")
    parser.add_argument("--against", metavar="REV", help="a commit whose relay runs beside")
    return parser.parse_args()


def streams(base_url: str, models: list[str]) -> tuple[int, int]:
    """Stream one Responses answer per model; (text deltas received, output tokens)."""
    deltas = tokens = 0
    with httpx2.Client(base_url=base_url, timeout=60) as client:
        for model in models:
            body = {"model": model, "input": "Tell me.", "stream": True}
            with client.stream("POST", "/responses", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if event["type"] == "response.output_text.delta":
                        deltas += 1
                    elif event["type"] == "response.completed":
                        tokens += event["response"]["usage"]["output_tokens"]
                    elif event["type"] in ("error", "response.failed"):
                        raise SystemExit(f"a stream failed: {event}")
    return deltas, tokens


def upstream_requests(chaos_url: str) -> int:
    return len(httpx2.get(chaos_url + "/_chaos/requests", timeout=10).json())


def main() -> None:
    args = parse_args()
    with contextlib.ExitStack() as stack:
        trees = {FOREGROUND: ROOT, BACKGROUND: ROOT}
        if args.against:
            trees = {f"{args.against} (foreground)": stack.enter_context(worktree(args.against))}
            trees |= {FOREGROUND: ROOT, BACKGROUND: ROOT}
        results = measure(args, trees, Path(stack.enter_context(tempfile.TemporaryDirectory())))
    report(args, results)


def measure(
    args: argparse.Namespace, trees: dict[str, Path], logs: Path
) -> dict[str, dict[str, dict[str, float]]]:
    """Every way's totals, by workload: CPU seconds, deltas, output tokens, requests."""
    ways = list(trees)
    chaos_port, *ports = free_ports(1 + len(ways))
    chaos_url = f"http://127.0.0.1:{chaos_port}"
    gateways = {way: f"http://127.0.0.1:{port}" for way, port in zip(ways, ports, strict=True)}
    results: dict[str, dict[str, dict[str, float]]] = {
        load: {way: {"cpu": 0.0, "deltas": 0, "tokens": 0, "requests": 0} for way in ways}
        for load in ("unbroken", "cut")
    }
    with contextlib.ExitStack() as stack:
        chaos_args = [str(BIN), "chaos-upstream", "--port", str(chaos_port)]
        chaos = stack.enter_context(spawned(chaos_args, log=logs / "chaos.log"))
        wait_ready(chaos, http_ok(chaos_url + "/v1/models"), "chaos")
        procs = {}
        for number, (way, tree) in enumerate(trees.items()):
            config = logs / f"{number}.yaml"
            background = "\n    background: true" if way == BACKGROUND else ""
            config.write_text(CONFIG.format(port=chaos_port, background=background))
            argv = [sys.executable, "-P", "-m", "gateway", "serve", "--config", str(config)]
            argv += ["--port", gateways[way].rsplit(":", 1)[1], "--log-level", "warning"]
            env = os.environ | {"PYTHONPATH": str(tree)}
            procs[way] = stack.enter_context(spawned(argv, env, logs / f"{number}.log"))
        for way, proc in procs.items():
            wait_ready(proc, http_ok(gateways[way] + "/readyz"), way)
        seed = 0
        for number in range(args.rounds + 1):  # the first round warms up
            order = ways[number % len(ways) :] + ways[: number % len(ways)]
            for load in ("unbroken", "cut"):
                for way in order:
                    models = []
                    for _ in range(args.streams):
                        seed += 1
                        model = f"chaos:text={DELTAS},seed={seed}"
                        if load == "cut":  # times=1 counts by spec: one per seed
                            model += f",fault=reset,at={DELTAS // 2},times=1"
                        models.append(model)
                    before = cpu_seconds(procs[way].pid), upstream_requests(chaos_url)
                    deltas, tokens = streams(gateways[way] + "/v1", models)
                    after = cpu_seconds(procs[way].pid), upstream_requests(chaos_url)
                    if number == 0:
                        continue
                    row = results[load][way]
                    row["cpu"] += after[0] - before[0]
                    row["deltas"] += deltas
                    row["tokens"] += tokens
                    row["requests"] += after[1] - before[1]
    return results


def report(args: argparse.Namespace, results: dict[str, dict[str, dict[str, float]]]) -> None:
    count = args.rounds * args.streams
    lines = [
        "## Background responses against today's Responses relay",
        "",
        f"- **Command:** `python -m bench.background --rounds {args.rounds} "
        f"--streams {args.streams}`",
        f"- **Machine:** {machine()}; commit `{commit()}`",
        f"- **Streams:** {count} per way and workload, {DELTAS} text deltas each, "
        "the gateways side by side in rotating order",
        "",
        "| workload | way | gateway CPU µs / delta | upstream requests / stream "
        "| output tokens generated / stream |",
        "|---|---|--:|--:|--:|",
    ]
    for load, ways in results.items():
        for way, row in ways.items():
            per_delta = row["cpu"] * 1e6 / max(row["deltas"], 1)
            lines.append(
                f"| {load} | {way} | {per_delta:.2f} | {row['requests'] / count:.2f} "
                f"| {row['tokens'] / count:.0f} |"
            )
    lines.append("")
    for load, ways in results.items():
        cost = {way: row["cpu"] / max(row["deltas"], 1) for way, row in ways.items()}
        ratios = [
            f"background ÷ {way}: {cost[BACKGROUND] / cost[way]:.3f}×"
            for way in ways
            if way != BACKGROUND
        ]
        lines.append(f"- {load}, gateway CPU per delta: " + "; ".join(ratios))
    print("\n".join(lines))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - started:.0f} s)")
