"""Upstream HTTP engines side by side: the gateway's own transport and httpx2's.

    .venv/bin/python -m bench.engines          # the full run, about 3.5 minutes
    .venv/bin/python -m bench.engines --quick  # a smoke run (tests), figures not meaningful

Targets, measured in one run against one upstream (``bench.upstream``):

- ``direct``: the client talks to the upstream itself (the baseline);
- ``builtin``, ``httpx``: the gateway (the real CLI, one process each, in-memory
  checkpoints: the default), identical but for the upstream's ``engine:``: the
  gateway's own HTTP/1.1 transport (``gateway/upstream/transport.py``) and httpx2's
  ``AsyncHTTPTransport`` (httpcore2's pool). httpx-aiohttp's ``AiohttpTransport``,
  measured here until the move to httpx2, works with httpx only (BENCHMARKS.md).

The harness is ``python -m bench``'s: its client, upstream and workloads, the
process roles and pinning (harness on CPU 0, every proxy on CPU 1), and rotations
of the targets so that each meets the same drift. Workloads: one stream's TTFT
(``workloads.ttft``, with each gateway's CPU per request over the whole workload)
and rounds of N concurrent streams of 64 deltas 20 ms apart, N = 1, 128, 256 by
default. CPU is read from ``/proc/PID/task/*/schedstat`` (nanoseconds) rather than
``/proc/PID/stat``'s clock ticks (10 ms), so that one stream's 64 deltas, a few
tens of ms of CPU, are measurable. Results go to ``bench/results/engines/``
(``results.json``, ``results.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench import report, workloads
from bench.procs import (
    commit,
    cpu_seconds,
    free_ports,
    http_ok,
    machine,
    pinned,
    spawned,
    wait_ready,
)
from bench.workloads import MS, PACE_MS, Roles, Sweep, Target, gateway_targets

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).with_name("resumable-gateway")
ENGINES = ("builtin", "httpx")
BASE = "builtin"
LABELS = {
    "direct": "direct (no proxy)",
    "builtin": "gateway, builtin engine (transport.py)",
    "httpx": "gateway, httpx engine (httpx2's, httpcore2)",
}
CONFIG = """
upstreams:
  - name: bench
    base_url: http://127.0.0.1:{port}/v1
    engine: {engine}
    timeouts: {{connect: 5, first_byte: 30, idle: 30}}
routes:
  - match: "*"
    upstream: bench
state:
  store: memory
"""
PACKAGES = ("httpx2", "httpcore2", "h2", "httptools", "uvloop")
HEADROOM = 80.0  # % of its core the harness may use before its figures are suspect
SCHEDSTAT = Path("/proc/self/schedstat").exists()


# ---------------------------------------------------------------- CPU, to the nanosecond


def run_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid``, from schedstat (ns); stat's ticks without it."""
    if not SCHEDSTAT:
        return cpu_seconds(pid)
    total = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(path.read_text().split()[0])
    return total / 1e9


@dataclass
class PreciseRoles(Roles):
    """``Roles`` whose proxy, upstream and client readings come from schedstat.

    ``other`` (the machine's busy time less the benchmark's) stays in clock ticks, as
    ``/proc/stat`` counts them.
    """

    def cpu(self, target: Target) -> dict[str, float]:
        readings = super().cpu(target)
        roles = {"proxy": target.proxy, "upstream": self.upstream, "client": [os.getpid()]}
        readings |= {role: sum(map(run_seconds, pids)) for role, pids in roles.items()}
        return readings


def proxy_cpu(target: Target) -> float:
    return sum(map(run_seconds, target.proxy))


# ---------------------------------------------------------------- the plan


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engines",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny workloads")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    parser.add_argument("--streams", help="concurrency levels (default 1,128,256)")
    parser.add_argument("--rounds", type=int, help="counted rounds per level and target")
    parser.add_argument("--chunks", type=int, help="deltas per stream (default 64)")
    parser.add_argument("--ttft-requests", type=int, help="one-stream requests per target")
    parser.add_argument("--out", type=Path, help="results directory")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    levels = args.streams or ("1,8" if quick else "1,128,256")
    return {
        "levels": [int(n) for n in levels.split(",")],
        "rounds": args.rounds or (1 if quick else 8),
        "warmup": 0 if quick else 1,
        "chunks": args.chunks or (16 if quick else workloads.CHUNKS),
        "pace_ms": PACE_MS,
        "ttft_requests": args.ttft_requests or (20 if quick else 500),
        "ttft_block": 10 if quick else 50,
    }


# ---------------------------------------------------------------- workloads


async def streams_round(
    target: Target, n: int, chunks: int, roles: Roles, sweep: Sweep, counted: bool
) -> None:
    """``workloads.streams_round`` with ``chunks`` deltas per stream instead of 64."""
    payload = workloads.body(workloads.model(chunks, PACE_MS), True)
    connections = target.connections(n)
    await workloads.connect_all(connections)
    before = roles.cpu(target)
    rss = asyncio.create_task(workloads.sample_rss(target, chunks * PACE_MS / MS / 2, sweep))
    started = time.perf_counter()
    results = await asyncio.gather(*(c.request(payload, stream=True) for c in connections))
    wall = time.perf_counter() - started
    await rss
    after = roles.cpu(target)
    for result in results:
        result.check(chunks)
    if counted:
        sweep.add(results, wall, {k: after[k] - before[k] for k in after})


async def concurrency(
    targets: Sequence[Target], p: dict[str, Any], roles: Roles
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, list[float | None]]]]:
    """Rows per target and N (as ``workloads.concurrency``), and each counted round's
    proxy CPU ms per delta (round r of every target at the same index)."""
    table: dict[str, dict[str, dict[str, Any]]] = {t.name: {} for t in targets}
    per_round: dict[str, dict[str, list[float | None]]] = {t.name: {} for t in targets}
    for n in p["levels"]:
        sweeps = {t.name: Sweep() for t in targets}
        for r, target in workloads.rotations(targets, p["rounds"], p["warmup"]):
            sweep = sweeps[target.name]
            cpu, chunks = sweep.cpu.get("proxy", 0.0), sweep.chunks
            await streams_round(target, n, p["chunks"], roles, sweep, r >= 0)
            if r >= 0 and target.proxy:
                done = sweep.chunks - chunks
                value = (sweep.cpu["proxy"] - cpu) * 1000 / done if done else None
                per_round[target.name].setdefault(str(n), []).append(value)
        for name, row in workloads.summaries(sweeps, n, p["rounds"]).items():
            table[name][str(n)] = row | {"deltas": sweeps[name].chunks}
    return table, per_round


async def ttft(targets: Sequence[Target], p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``workloads.ttft``, with each gateway's CPU per request (start and 4 deltas).

    Only the target being measured has traffic, so a gateway's CPU over the whole
    workload is its requests' (warm-up block included) and its idle timers'.
    """
    before = {t.name: proxy_cpu(t) for t in targets if t.proxy}
    out = await workloads.ttft(targets, p["ttft_requests"], p["ttft_block"])
    served = (-(-p["ttft_requests"] // p["ttft_block"]) + 1) * p["ttft_block"]
    for t in targets:
        if t.proxy:
            out[t.name]["cpu_ms_per_request"] = (proxy_cpu(t) - before[t.name]) * MS / served
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary(
    results: dict[str, Any], per_round: dict[str, dict[str, list[float | None]]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per N (and ``"ttft"``, one stream), each engine's figures and its ratio to builtin."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    levels = results["concurrency"]
    one = results["ttft"]
    out["ttft"] = {
        e: {
            "added_p50": one[e]["added_p50"],
            "added_p99": one[e]["added_p99"],
            "cpu_ms_per_request": one[e]["cpu_ms_per_request"],
            "cpu_ratio": ratio(one[e]["cpu_ms_per_request"], one[BASE]["cpu_ms_per_request"]),
            "errors": one[e]["errors"],
        }
        for e in ENGINES
    }
    for n in levels[BASE]:
        base = levels[BASE][n]
        out[n] = {}
        for e in ENGINES:
            row = levels[e][n]
            paired = [
                mine / theirs
                for mine, theirs in zip(per_round[e][n], per_round[BASE][n], strict=True)
                if mine is not None and theirs
            ]
            out[n][e] = {
                "cpu_ms_per_delta": row["cpu_s_per_1000_chunks"],
                "cpu_ratio": ratio(row["cpu_s_per_1000_chunks"], base["cpu_s_per_1000_chunks"]),
                "cpu_ratio_rounds": {
                    "median": statistics.median(paired) if paired else None,
                    "min": min(paired, default=None),
                    "max": max(paired, default=None),
                },
                "frames_vs_direct": row["vs_direct"],
                "stalled": row["stalled"],
                "total_streams": row["total_streams"],
                "gap_p99": row["gap_p99"],
                "added_gap_p99": row["added_gap_p99"],
                "ttft_p50": row["ttft_p50"],
                "ttft_p99": row["ttft_p99"],
                "errors": row["errors"],
                "proxy_cpu_pct": row["cpu_pct"].get("proxy"),
                "rss_mb": row["rss_kb"] / 1024 if row["rss_kb"] else None,
            }
    return out


async def measure(targets: list[Target], roles: Roles, p: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["ttft"] = await ttft(targets, p)
    out["concurrency"], out["per_round_cpu_ms_per_delta"] = await concurrency(targets, p, roles)
    out["summary"] = summary(out, out["per_round_cpu_ms_per_delta"])
    for connection in [c for t in targets for c in t.pool]:
        await connection.close()
    return out


def headroom_notes(results: dict[str, Any]) -> list[str]:
    worst = (0.0, "", "")
    for name, rows in results["concurrency"].items():
        for n, row in rows.items():
            pct = row["cpu_pct"]
            worst = max(worst, (pct.get("upstream", 0) + pct.get("client", 0), name, n))
    notes = [
        f"Harness headroom: the client and upstream together used at most {worst[0]:.0f}% "
        f"of their core (target {worst[1]}, {worst[2]} streams)."
    ]
    if worst[0] > HEADROOM:
        notes.append(f"WARNING: above {HEADROOM:.0f}%: the harness may be the bottleneck.")
    others = [
        row["cpu_pct"].get("other", 0.0)
        for rows in results["concurrency"].values()
        for row in rows.values()
    ]
    notes.append(
        f"Other processes (the machine's busy time less the benchmark's) used "
        f"{statistics.mean(others):.0f}% of one core on average during the rounds, at most "
        f"{max(others):.0f}% (of the machine's {100 * (os.cpu_count() or 1)}%)."
    )
    return notes


# ---------------------------------------------------------------- markdown


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    align = [":--" if i < left else "--:" for i in range(len(headers))]
    return [line(headers), line(align), *(line(r) for r in rows), ""]


def spread(row: dict[str, Any]) -> str:
    rounds = row["cpu_ratio_rounds"]
    if rounds["min"] is None:
        return report.DASH
    return f"{report.RATIO(rounds['min'])}–{report.RATIO(rounds['max'])}"


def micro(value: Any) -> str:
    """ms as µs, no decimals."""
    return report.DASH if value is None else report.RATE(value * 1000)


def markdown(results: dict[str, Any]) -> str:
    meta, summ = results["meta"], results["summary"]
    lines = ["## Upstream HTTP engines", ""]
    if meta["quick"]:
        lines += ["> **Quick smoke run:** the figures only show that the harness works.", ""]
    load = meta["loadavg"]
    lines += [
        f"- **Date:** {meta['date']}",
        f"- **Command:** `{meta['command']}`",
        f"- **Machine:** {meta['machine']}",
        f"- **Load average (1, 5, 15 min):** {load['start']} at the start, {load['end']} at "
        "the end",
        f"- **Commit:** `{meta['commit']}`",
        f"- **Packages:** {', '.join(f'{k} {v}' for k, v in meta['packages'].items())}",
        f"- **Pinning:** {meta['pinning']}",
        f"- **CPU readings:** {meta['cpu_source']}",
        f"- **Runtime:** {meta['runtime_s']:.0f} s",
        f"- **Plan:** {meta['plan']['rounds']} counted rounds (+{meta['plan']['warmup']} "
        f"warm-up) per N and target, {meta['plan']['chunks']} deltas "
        f"{meta['plan']['pace_ms']} ms apart per stream; {meta['plan']['ttft_requests']} "
        "one-stream requests per target",
        "",
        *(f"- {note}" for note in meta["notes"]),
        "",
        "CPU is the gateway process's, per content delta relayed (start of the request "
        "included); “× builtin” is its ratio to the builtin engine's over all counted "
        "rounds, “rounds” the range of the same ratio round by round (round r of each).",
        "",
        "### Summary",
        "",
    ]
    rows = []
    for n in sorted((k for k in summ if k != "ttft"), key=int):
        for e in ENGINES:
            row = summ[n][e]
            rows.append(
                [
                    n,
                    e,
                    micro(row["cpu_ms_per_delta"]),
                    report.RATIO(row["cpu_ratio"]),
                    spread(row),
                    report.RATIO(row["frames_vs_direct"]),
                    f"{row['stalled']}/{row['total_streams']}",
                    report.MS(row["gap_p99"]),
                    report.SIGNED_MS(row["added_gap_p99"]),
                    report.MS(row["ttft_p99"]),
                    report.COUNT(row["errors"]),
                    report.ONE(row["proxy_cpu_pct"]),
                ]
            )
    lines += table(
        [
            "N",
            "engine",
            "CPU µs / delta",
            "× builtin",
            "rounds",
            "frames/s × direct",
            "streams with gap > 40 ms",
            "gap p99",
            "added gap p99",
            "TTFT p99",
            "errors",
            "proxy CPU %",
        ],
        rows,
        left=2,
    )
    lines += ["### One stream: time to first token", ""]
    one = results["ttft"]
    lines += table(
        ["config", "n", "p50", "p99", "added p50", "added p99", "CPU ms / request", "× builtin"]
        + ["errors"],
        [
            [
                LABELS[name],
                report.COUNT(row["n"]),
                report.MS(row["p50"]),
                report.MS(row["p99"]),
                report.SIGNED_MS(row["added_p50"]),
                report.SIGNED_MS(row["added_p99"]),
                report.CPU_S(row.get("cpu_ms_per_request")),
                report.RATIO(summ["ttft"][name]["cpu_ratio"]) if name in ENGINES else report.DASH,
                report.COUNT(row["errors"]),
            ]
            for name, row in one.items()
        ],
    )
    lines += ["### Concurrent streams, every target", ""]
    rows = []
    cpu_rows = []
    for n in sorted(results["concurrency"]["direct"], key=int):
        for name, levels in results["concurrency"].items():
            row = levels[n]
            rows.append(
                [
                    n,
                    LABELS[name],
                    report.RATE(row["frames_per_s"]),
                    report.RATIO(row["vs_direct"]),
                    report.MS(row["gap_p50"]),
                    report.MS(row["gap_p99"]),
                    f"{row['stalled']}/{row['total_streams']}",
                    report.COUNT(row["errors"]),
                    report.MS(row["ttft_p50"]),
                    report.MS(row["ttft_p99"]),
                    report.CPU_S(row["cpu_s_per_1000_chunks"]),
                    report.ONE(row["rss_kb"] / 1024 if row["rss_kb"] else None),
                ]
            )
            pct = row["cpu_pct"]
            cpu_rows.append(
                [n, LABELS[name]]
                + [report.ONE(pct.get(k)) for k in ("proxy", "upstream", "client", "other")]
            )
    lines += table(
        ["N", "config", "frames/s", "× direct", "gap p50", "gap p99", "streams with gap > 40 ms"]
        + ["errors", "TTFT p50", "TTFT p99", "CPU s / 1000 chunks", "RSS MB mid-round"],
        rows,
        left=2,
    )
    lines += ["### CPU use during the rounds (% of one core)", ""]
    lines += table(["N", "config", "proxy", "upstream", "client", "other"], cpu_rows, left=2)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- the run


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def loadavg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    p = plan(args)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    harness_cpu, proxy_cpu_set = ("0", "1") if pin else (None, None)
    if pin:
        os.sched_setaffinity(0, {0})
    load_start = loadavg()
    started = time.monotonic()
    ports = dict(zip(("bench", *ENGINES), free_ports(1 + len(ENGINES)), strict=True))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)

        def start(name: str, argv: list[str], cpus: str | None) -> subprocess.Popen[bytes]:
            return stack.enter_context(spawned(pinned(argv, cpus), None, logs / f"{name}.log"))

        py = sys.executable
        bench = start(
            "bench", [py, "-m", "bench.upstream", "--port", str(ports["bench"])], harness_cpu
        )
        proxies = {}
        for engine in ENGINES:
            config = logs / f"{engine}.yaml"
            config.write_text(CONFIG.format(port=ports["bench"], engine=engine))
            argv = [str(BIN), "serve", "--config", str(config), "--port", str(ports[engine])]
            proxies[engine] = start(engine, [*argv, "--log-level", "warning"], proxy_cpu_set)
        wait_ready(bench, http_ok(f"http://127.0.0.1:{ports['bench']}/v1/models"), "bench upstream")
        targets = gateway_targets(ports["bench"], proxies, ports, logs, timeout=120)
        roles = PreciseRoles(
            upstream=[bench.pid],
            redis=[],
            everything=[os.getpid(), bench.pid, *(pid for t in targets for pid in t.proxy)],
        )
        results = uvloop.run(measure(targets, roles, p))

    results["configs"] = ["direct", *ENGINES]
    results["labels"] = LABELS
    now = datetime.datetime.now(datetime.UTC)
    results["meta"] = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ("python -m bench.engines " + shlex.join(sys.argv[1:])).strip(),
        "quick": args.quick,
        "machine": machine(),
        "loadavg": {"start": load_start, "end": loadavg()},
        "commit": commit(),
        "packages": versions(),
        "pinning": (
            "harness (client, upstream) on CPU 0; each gateway on CPU 1" if pin else "none"
        ),
        "cpu_source": (
            "/proc/PID/task/*/schedstat (ns)" if SCHEDSTAT else "/proc/PID/stat (clock ticks)"
        ),
        "plan": p,
        "runtime_s": time.monotonic() - started,
        "notes": headroom_notes(results),
    }
    out = args.out or ROOT / "bench" / "results" / ("quick/engines" if args.quick else "engines")
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(results)
    (out / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    (out / "results.md").write_text(text)
    print(text)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # the processes are already cleaned up
        raise SystemExit(130) from None
