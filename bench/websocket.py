"""A turn over a WebSocket against the same turn over HTTP (issue 39).

    .venv/bin/python -m bench.websocket                  # 10 rounds of 20 turns each way
    .venv/bin/python -m bench.websocket --rounds 3 --turns 5

One gateway (the real CLI, default config) in front of one chaos upstream, in one run.
A round is 20 turns of an agent's loop, each way in turn, alternating which goes
first: over HTTP, each turn is a ``POST /v1/responses`` (SSE) on one kept-alive
connection carrying the whole conversation so far, as an HTTP agent sends it; over
the socket, each turn is a ``response.create`` with ``previous_response_id`` and only
the new input, on one socket (the gateway expands it for its HTTP upstream, as Codex
uses the mode). ``direct`` is the same HTTP turns straight to the upstream (the
baseline). Timed per turn: from sending to the first text delta (TTFT) and to the
terminal event, by the client; the gateway's CPU per turn from its process's
``/proc`` stat. Reported: medians and p90 each way, and the socket's ratio to HTTP.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
from websockets.sync.client import ClientConnection, connect

from bench.procs import commit, cpu_seconds, free_ports, http_ok, machine, spawned, wait_ready
from bench.starts import CONFIG

BIN = Path(sys.executable).with_name("resumable-gateway")
MODEL = "chaos:text=64,seed=90"
Timing = dict[str, list[float]]  # ttft and turn, in ms, one per turn


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.websocket", description=__doc__)
    parser.add_argument("--rounds", type=int, default=10, help="rounds of turns each way")
    parser.add_argument("--turns", type=int, default=20, help="turns per round (one socket)")
    return parser.parse_args()


def http_turns(base_url: str, turns: int) -> Timing:
    """An agent's loop over HTTP: every turn sends the whole conversation."""
    timing: Timing = {"ttft": [], "turn": []}
    conversation: list[Any] = []
    with httpx2.Client(base_url=base_url, timeout=30) as client:
        for number in range(turns):
            conversation.append({"role": "user", "content": f"Turn {number}."})
            body = {"model": MODEL, "input": conversation, "stream": True, "store": False}
            started = time.perf_counter()
            first = None
            output: list[Any] = []
            with client.stream("POST", "/responses", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if first is None and event["type"] == "response.output_text.delta":
                        first = time.perf_counter()
                    if event["type"] == "response.completed":
                        output = event["response"]["output"]
            ended = time.perf_counter()
            conversation.extend(output)
            timing["ttft"].append(((first or ended) - started) * 1000)
            timing["turn"].append((ended - started) * 1000)
    return timing


def socket_turns(url: str, turns: int) -> Timing:
    """The same loop on one socket: each turn only its new input and the last id."""
    timing: Timing = {"ttft": [], "turn": []}
    previous: str | None = None
    with connect(url) as ws:
        for number in range(turns):
            create: dict[str, Any] = {
                "type": "response.create",
                "model": MODEL,
                "input": [{"role": "user", "content": f"Turn {number}."}],
                "store": False,
            }
            if previous is not None:
                create["previous_response_id"] = previous
            started = time.perf_counter()
            ws.send(json.dumps(create))
            first, previous = _until_done(ws)
            ended = time.perf_counter()
            timing["ttft"].append(((first or ended) - started) * 1000)
            timing["turn"].append((ended - started) * 1000)
    return timing


def _until_done(ws: ClientConnection) -> tuple[float | None, str]:
    first = None
    while True:
        event = json.loads(ws.recv(timeout=30))
        if first is None and event["type"] == "response.output_text.delta":
            first = time.perf_counter()
        if event["type"] == "response.completed":
            return first, event["response"]["id"]
        if event["type"] in ("error", "response.failed"):
            raise SystemExit(f"the socket's turn failed: {event}")


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
    }


def main() -> None:
    args = parse_args()
    chaos_port, gateway_port = free_ports(2)
    gateway = f"http://127.0.0.1:{gateway_port}"
    with tempfile.TemporaryDirectory(prefix="bench-websocket-") as scratch:
        config = Path(scratch) / "gateway.yaml"
        config.write_text(CONFIG.format(port=chaos_port))
        chaos_args = [str(BIN), "chaos-upstream", "--port", str(chaos_port)]
        serve = [str(BIN), "serve", "--config", str(config), "--port", str(gateway_port)]
        logs = Path(scratch)
        with (
            spawned(chaos_args, log=logs / "chaos.log") as chaos,
            spawned(serve, log=logs / "gateway.log") as proxy,
        ):
            wait_ready(chaos, http_ok(f"http://127.0.0.1:{chaos_port}/v1/models"), "chaos")
            wait_ready(proxy, http_ok(f"{gateway}/readyz"), "gateway")
            ways: dict[str, Callable[[], Timing]] = {
                "direct (HTTP)": lambda: http_turns(
                    f"http://127.0.0.1:{chaos_port}/v1", args.turns
                ),
                "gateway, HTTP": lambda: http_turns(gateway + "/v1", args.turns),
                "gateway, WebSocket": lambda: socket_turns(
                    gateway.replace("http://", "ws://") + "/v1/responses", args.turns
                ),
            }
            timings: dict[str, Timing] = {name: {"ttft": [], "turn": []} for name in ways}
            cpu: dict[str, float] = dict.fromkeys(ways, 0.0)
            for way in ways.values():
                way()  # warm-up
            names = list(ways)
            for number in range(args.rounds):
                order = names if number % 2 == 0 else names[::-1]
                for name in order:
                    before = cpu_seconds(proxy.pid)
                    timing = ways[name]()
                    cpu[name] += cpu_seconds(proxy.pid) - before
                    for key, values in timing.items():
                        timings[name][key] += values
    report(args, timings, cpu)


def report(args: argparse.Namespace, timings: dict[str, Timing], cpu: dict[str, float]) -> None:
    turns = args.rounds * args.turns
    http, ws = timings["gateway, HTTP"], timings["gateway, WebSocket"]
    lines = [
        "## A turn over a WebSocket against HTTP",
        "",
        f"- **Command:** `python -m bench.websocket --rounds {args.rounds} --turns {args.turns}`",
        f"- **Machine:** {machine()}; commit `{commit()}`",
        f"- **Turns:** {turns} each way ({args.rounds} rounds of {args.turns}, one socket or "
        f"one kept-alive HTTP connection a round), answer `{MODEL}`",
        "",
        "| way | TTFT p50 (ms) | TTFT p90 | turn p50 (ms) | turn p90 | gateway CPU ms / turn |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for name, timing in timings.items():
        ttft, turn = summary(timing["ttft"]), summary(timing["turn"])
        gateway_cpu = "—" if name.startswith("direct") else f"{cpu[name] * 1000 / turns:.2f}"
        lines.append(
            f"| {name} | {ttft['p50']} | {ttft['p90']} | {turn['p50']} | {turn['p90']} "
            f"| {gateway_cpu} |"
        )
    ratio = statistics.median(ws["turn"]) / statistics.median(http["turn"])
    added = statistics.median(ws["turn"]) - statistics.median(timings["direct (HTTP)"]["turn"])
    lines += [
        "",
        f"WebSocket ÷ HTTP through the gateway, median turn: {ratio:.2f}×; the socket's turn "
        f"adds {added:+.2f} ms to a direct HTTP turn's median.",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
