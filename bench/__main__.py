"""Benchmarks: the gateway side by side with a direct connection and with LiteLLM's proxy.

    .venv/bin/python -m bench              # the full run, about 10 minutes
    .venv/bin/python -m bench --quick      # a smoke run (CI), figures not meaningful

Targets, measured in one run against one upstream:

- ``direct``: the client talks to the upstream itself (the physical limit);
- ``off``, ``memory``, ``redis``: the gateway (the real CLI, one process each)
  with checkpoints off, in memory, and in a redis-server started here;
- ``litellm``: LiteLLM's proxy, installed from PyPI into ``bench/.venv-litellm``
  on first use (``--no-litellm`` leaves it out).

The upstream is ``bench.upstream`` (pre-rendered SSE, its own process); recoveries
use the fault-injecting chaos upstream. On a machine with two or more CPUs the
harness (client, upstreams, redis-server) is pinned to CPU 0 and each proxy to
CPU 1, so a proxy has a core to itself and the harness's load is the same for
every target. Workloads (``bench.workloads``): one stream's TTFT; N concurrent
streams of 64 deltas 20 ms apart; non-streaming requests at concurrency 64;
seam latency; CPU and RSS of the proxy. The Responses API (``POST /v1/responses``)
gets its own row, against direct and the gateway three ways: one stream's TTFT,
chat and Responses rounds of 128 streams side by side (the gateway's CPU per
relayed delta, Responses over chat), and seam latency. The Anthropic Messages API
(``POST /v1/messages``) gets the same row against the chaos upstream (the bench
upstream does not speak Messages): one stream's TTFT, chat and Messages rounds of
128 streams from it side by side, and seam latency; the Gemini API
(``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``) the same again, on a
``kind: gemini`` upstream in front of the chaos upstream's Gemini door. ``--only``
runs some of these rows (``--only gemini``: the Gemini row, chat beside it from the
chaos upstream, and the chat seam its summary quotes). Results go to ``bench/results/``
(``results.json``, ``results.md``, ``chart.png``); ``--publish`` also puts the
tables into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import uvloop

from bench import litellm, report, workloads
from bench.procs import (
    commit,
    free_ports,
    http_ok,
    machine,
    memory_kb,
    pinned,
    redis_ok,
    spawned,
    tree,
    wait_ready,
    worktree,
)
from bench.workloads import Roles, Target

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).with_name("resumable-gateway")
GATEWAYS = ("off", "memory", "redis", "redis-async")
LABELS = {
    "direct": "direct (no proxy)",
    "off": "gateway, checkpoints off",
    "memory": "gateway, in-memory checkpoints (default)",
    "redis": "gateway, Redis checkpoints (durability sync, the default)",
    "redis-async": "gateway, Redis checkpoints, durability async",
    "litellm": "LiteLLM proxy",
}
GATEWAY_CONFIG = """
upstreams:
  - name: bench
    base_url: http://127.0.0.1:{bench}/v1
    timeouts: {{connect: 5, first_byte: 30, idle: 30}}
  - name: chaos
    base_url: http://127.0.0.1:{chaos}/v1
    timeouts: {{connect: 2, first_byte: 5, idle: 5}}
  # The same server's /v1/messages; base_url as the anthropic SDK takes it (no /v1).
  - name: chaos-anthropic
    kind: anthropic
    base_url: http://127.0.0.1:{chaos}
    timeouts: {{connect: 2, first_byte: 5, idle: 5}}
  # Its Gemini door: base_url the API root with its version; no api_key, so the
  # client's x-goog-api-key is passed on.
  - name: chaos-gemini
    kind: gemini
    base_url: http://127.0.0.1:{chaos}/v1beta
    timeouts: {{connect: 2, first_byte: 5, idle: 5}}
routes:
  # A request takes the first route that matches and serves its API.
  - match: "chaos:*"
    upstream: chaos
    retry: {{retries: 2, backoff_initial: 0, backoff_max: 0, idle_retry_delay: 0}}
  - match: "chaos:*"
    upstream: chaos-anthropic
    retry: {{retries: 2, backoff_initial: 0, backoff_max: 0, idle_retry_delay: 0}}
  - match: "chaos:*"
    upstream: chaos-gemini
    retry: {{retries: 2, backoff_initial: 0, backoff_max: 0, idle_retry_delay: 0}}
  - match: "*"
    upstream: bench
state:
  {state}
"""
# Quoted: an unquoted YAML `off` is the boolean false, which the config rejects.
STATES = {
    "off": 'store: "off"',
    "memory": "store: memory",
    "redis": "redis_url: {redis}",
    "redis-async": "redis_url: {redis}\n  durability: async",
}
HEADROOM = 80.0  # % of its core the harness may use before its figures are suspect
# The rows --only picks from: chat's workloads (against every target), then the
# protocols' rows, each side by side with chat.
ROWS = ("chat", "responses", "messages", "gemini")
CHAOS_ROWS = {"messages": workloads.MESSAGES, "gemini": workloads.GEMINI}


def rows_arg(value: str) -> tuple[str, ...]:
    rows = tuple(row.strip() for row in value.split(",") if row.strip())
    unknown = [row for row in rows if row not in ROWS]
    if unknown or not rows:
        raise argparse.ArgumentTypeError(f"rows are among {', '.join(ROWS)}; not {unknown}")
    return tuple(row for row in ROWS if row in rows)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny workloads")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    parser.add_argument(
        "--workers", type=int, help="worker processes per gateway (default: serve's default)"
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run the default gateway at commit REV (a git worktree), side by side",
    )
    parser.add_argument(
        "--only",
        type=rows_arg,
        default=ROWS,
        metavar="ROWS",
        help=f"run only these rows, from {','.join(ROWS)} (default: all); without chat, "
        "LiteLLM is left out and chat's seam still runs for the protocol rows' summaries",
    )
    parser.add_argument("--streams", help="concurrency levels, e.g. 1,32,128,256,512")
    parser.add_argument("--rounds", type=int, help="counted rounds per level and target")
    parser.add_argument("--ttft-requests", type=int, help="one-stream requests per target")
    parser.add_argument("--recoveries", type=int, help="seam measurements per gateway")
    parser.add_argument("--out", type=Path, help="results directory (default bench/results)")
    parser.add_argument(
        "--publish", action="store_true", help="also write the tables into BENCHMARKS.md"
    )
    parser.add_argument(
        "--litellm-venv",
        type=Path,
        default=ROOT / "bench" / ".venv-litellm",
        help=argparse.SUPPRESS,
    )
    return parser.parse_args()


def plan(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    levels = args.streams or ("1,8" if quick else "1,32,128,256,512")
    return {
        "levels": [int(n) for n in levels.split(",")],
        "rounds": args.rounds or (1 if quick else 3),
        "warmup": 0 if quick else 1,
        "ttft_requests": args.ttft_requests or (20 if quick else 500),
        "ttft_block": 10 if quick else 50,
        "nonstream_workers": 8 if quick else 64,
        "nonstream_each": 2 if quick else 40,
        "nonstream_rounds": 1 if quick else 3,
        "recoveries": args.recoveries or (3 if quick else 200),
        # The Responses row: chat and Responses rounds side by side at one N.
        "responses_streams": 8 if quick else 128,
        "responses_rounds": 1 if quick else 5,
        # The Messages row: the same, chat and Messages rounds from the chaos upstream.
        "messages_streams": 8 if quick else 128,
        "messages_rounds": 1 if quick else 5,
        # The Gemini row: as the Messages row.
        "gemini_streams": 8 if quick else 128,
        "gemini_rounds": 1 if quick else 5,
        "rows": list(args.only),
    }


async def measure(
    targets: list[Target], chaos: Target, roles: Roles, p: dict[str, Any]
) -> dict[str, Any]:
    # Connections stay open across phases, as an SDK's pool keeps them.
    out: dict[str, Any] = {}
    rows = p["rows"]
    gateways = [t for t in targets if t.name in GATEWAYS]
    direct_chaos = Target("direct", chaos.port)  # the chaos rows' baseline, its own connections
    if "chat" in rows:
        await chat(out, targets, gateways, roles, p, chaos)
    else:  # the protocol rows' summaries quote chat's seam
        out["seam"] = await workloads.seam(gateways, chaos, p["recoveries"])
    if "responses" in rows:
        out["responses"] = await responses(targets, chaos, roles, p, out)
    for key, protocol in CHAOS_ROWS.items():
        if key in rows:
            out[key] = await chaos_row(targets, chaos, direct_chaos, roles, p, out, protocol)
    for connection in [c for t in [*targets, chaos, direct_chaos] for c in t.pool]:
        await connection.close()
    return out


async def chat(
    out: dict[str, Any],
    targets: list[Target],
    gateways: list[Target],
    roles: Roles,
    p: dict[str, Any],
    chaos: Target,
) -> None:
    """Chat's workloads against every target, into ``out``."""
    out["ttft"] = await workloads.ttft(targets, p["ttft_requests"], p["ttft_block"])
    idle = {t.name: sum(memory_kb(pid, "VmRSS") for pid in t.proxy) for t in targets if t.proxy}
    out["concurrency"] = await workloads.concurrency(
        targets, p["levels"], p["rounds"], p["warmup"], roles
    )
    out["nonstream"] = await workloads.nonstream(
        targets, p["nonstream_workers"], p["nonstream_each"], p["nonstream_rounds"]
    )
    out["seam"] = await workloads.seam(gateways, chaos, p["recoveries"])
    top = str(max(p["levels"]))
    out["resources"] = {}
    for name, kb in idle.items():
        row = out["concurrency"][name][top]
        loaded = row.pop("rss_kb")
        out["resources"][name] = {
            "cpu_s_per_1000_chunks": row["cpu_s_per_1000_chunks"],
            "rss_idle_mb": kb / 1024,
            "rss_loaded_mb": loaded / 1024 if loaded else None,
            "streams": int(top),
            "rss_per_stream_kb": (loaded - kb) / int(top) if loaded else None,
        }
    out["stall_free"] = {
        name: workloads.stall_free(rows) for name, rows in out["concurrency"].items()
    }


async def responses(
    targets: list[Target], chaos: Target, roles: Roles, p: dict[str, Any], done: dict[str, Any]
) -> dict[str, Any]:
    """The Responses API row: direct and the gateways (LiteLLM is left out), next to chat.

    ``done`` holds the chat workloads' results (``ttft``, ``seam``), for the summary.
    """
    # Not durability async: the protocols' costs compare the same way on either.
    ours = [t for t in targets if t.name == "direct" or t.name in GATEWAYS[:3]]
    gateways = [t for t in ours if t.name in GATEWAYS]
    rsp, n = workloads.RESPONSES, p["responses_streams"]
    out: dict[str, Any] = {"streams": n}
    out["ttft"] = await workloads.ttft(ours, p["ttft_requests"], p["ttft_block"], rsp)
    out["concurrency"] = await workloads.protocols(
        ours, n, p["responses_rounds"], p["warmup"], roles
    )
    out["seam"] = await workloads.seam(gateways, chaos, p["recoveries"], rsp)
    out["summary"] = summary(out, gateways, rsp, done["ttft"], done["seam"])
    return out


async def chaos_row(
    targets: list[Target],
    chaos: Target,
    direct: Target,
    roles: Roles,
    p: dict[str, Any],
    done: dict[str, Any],
    msg: str,
) -> dict[str, Any]:
    """The Messages or Gemini API row (``msg``): direct and the gateways, against the
    chaos upstream.

    As the Responses row, but the bench upstream speaks neither: the CPU rounds ask
    the chaos upstream for the same answer shape (``CHUNKS`` text deltas, events
    ``PACE_MS`` apart) over chat and over ``msg``, side by side, and one stream's
    TTFT, ``msg`` then chat, is measured against ``direct`` (to the chaos upstream).
    ``done`` holds the chat seam workload's results, for the summary.
    """
    # With --against, REV's gateway too: a protocol's row before and after, side by side.
    ours = [direct] + [t for t in targets if t.name in (*GATEWAYS[:3], "baseline")]
    gateways = ours[1:]
    chat, n = workloads.CHAT, p[f"{msg}_streams"]
    paced = workloads.chaos_model(workloads.CHUNKS, workloads.PACE_MS)
    at_once = workloads.chaos_model(workloads.TTFT_CHUNKS, 0)
    # CPU accounting: the chaos upstream is the upstream of these rounds.
    chaos_roles = dataclasses.replace(roles, upstream=roles.chaos)
    out: dict[str, Any] = {"streams": n, "upstream": "chaos"}
    out["ttft"] = await workloads.ttft(ours, p["ttft_requests"], p["ttft_block"], msg, at_once)
    out["chat_ttft"] = await workloads.ttft(
        ours, p["ttft_requests"], p["ttft_block"], chat, at_once
    )
    out["concurrency"] = await workloads.protocols(
        ours, n, p[f"{msg}_rounds"], p["warmup"], chaos_roles, msg, paced
    )
    out["seam"] = await workloads.seam(gateways, chaos, p["recoveries"], msg)
    out["summary"] = summary(out, gateways, msg, out["chat_ttft"], done["seam"])
    return out


def summary(
    out: dict[str, Any],
    gateways: list[Target],
    protocol: str,
    chat_ttft: dict[str, Any],
    chat_seam: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """A protocol's row next to chat's, per gateway: CPU per delta (CPU s per 1000
    deltas is CPU ms per delta) and its ratio, frames/s, added TTFT and seam."""
    chat, n = workloads.CHAT, out["streams"]
    rows = {}
    for t in gateways:
        mine = out["concurrency"][protocol][t.name]["cpu_s_per_1000_chunks"]
        theirs = out["concurrency"][chat][t.name]["cpu_s_per_1000_chunks"]
        seam = out["seam"][t.name]
        rows[t.name] = {
            "streams": n,
            "chat_cpu_ms_per_delta": theirs,
            f"{protocol}_cpu_ms_per_delta": mine,
            "cpu_ratio": mine / theirs if mine is not None and theirs else None,
            "chat_frames_vs_direct": out["concurrency"][chat][t.name]["vs_direct"],
            f"{protocol}_frames_vs_direct": out["concurrency"][protocol][t.name]["vs_direct"],
            "chat_ttft_added_p50": chat_ttft.get(t.name, {}).get("added_p50"),
            "ttft_added_p50": out["ttft"][t.name]["added_p50"],
            "ttft_added_p99": out["ttft"][t.name]["added_p99"],
            "chat_seam_excess_p50": chat_seam.get(t.name, {}).get("excess_p50"),
            "seam_excess_p50": seam["excess_p50"],
            "seam_excess_p99": seam["excess_p99"],
        }
    return rows


def targets_met(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, judged on the default gateway (in-memory checkpoints)."""
    rows: list[dict[str, Any]] = []

    def check(name: str, target: str, value: float | None, limit: float, unit: str = "") -> None:
        below = target.startswith("≤")
        met = value is not None and (value <= limit if below else value >= limit)
        measured = "not measured" if value is None else f"{value:.3g}{unit}"
        rows.append({"name": name, "target": target, "measured": measured, "met": met})

    ours = "memory"
    if "concurrency" in results:
        chat_targets(results, check)
    # Gemini: issue 38 names no figure; the Messages row's targets, carried over.
    limits = {"responses": ("Responses", 1.25), "messages": ("Messages", 1.15)}
    limits["gemini"] = ("Gemini", 1.15)
    for key, (name, limit) in limits.items():
        if key not in results:
            continue
        row = results[key].get("summary", {}).get(ours, {})
        n = results[key].get("streams")
        check(
            f"{name} CPU per delta vs chat's, {n} streams",
            f"≤ {limit:g}×",
            row.get("cpu_ratio"),
            limit,
            "×",
        )
        check(f"{name} added TTFT p50, one stream", "≤ 1 ms", row.get("ttft_added_p50"), 1.0, " ms")
        for q in ("p50", "p99"):
            excess = row.get(f"seam_excess_{q}")
            check(f"{name} seam {q} minus new leg's TTFT {q}", "≤ 5 ms", excess, 5.0, " ms")
    return rows


class Check(Protocol):
    def __call__(
        self, name: str, target: str, value: float | None, limit: float, unit: str = ""
    ) -> None: ...


def chat_targets(results: dict[str, Any], check: Check) -> None:
    """The chat workloads' targets (issue 1 and after), on the default gateway."""
    ttft, levels = results["ttft"], results["concurrency"]
    ours = "memory"
    one = ttft.get(ours, {})
    check("Added TTFT p50, one stream", "≤ 1 ms", one.get("added_p50"), 1.0, " ms")
    check("Added TTFT p99, one stream", "≤ 2 ms", one.get("added_p99"), 2.0, " ms")
    at = levels.get(ours, {}).get("256", {})
    check("Frames/s vs direct, 256 streams", "≥ 0.97×", at.get("vs_direct"), 0.97, "×")
    check("Added gap p99, 256 streams", "≤ 5 ms", at.get("added_gap_p99"), 5.0, " ms")
    check("Streams with a gap > 40 ms, 256 streams", "≤ 0", at.get("stalled"), 0)
    check("Errors, 256 streams", "≤ 0", at.get("errors"), 0)
    direct_ttft = levels.get("direct", {}).get("256", {}).get("ttft_p99")
    check(
        "TTFT p99 vs direct's, 256 streams",
        "≤ 2×",
        at.get("ttft_p99") / direct_ttft if at.get("ttft_p99") and direct_ttft else None,
        2.0,
        "×",
    )
    for name in (ours, "redis"):
        big = levels.get(name, {}).get("512", {})
        label = "default" if name == ours else "Redis"
        check(
            f"Frames/s vs direct, 512 streams ({label})", "≥ 0.97×", big.get("vs_direct"), 0.97, "×"
        )
        check(f"Streams with a gap > 40 ms, 512 streams ({label})", "≤ 0", big.get("stalled"), 0)
        check(f"Errors, 512 streams ({label})", "≤ 0", big.get("errors"), 0)
        pct = big.get("cpu_pct", {})
        harness = pct.get("upstream", 0) + pct.get("client", 0) + pct.get("redis", 0)
        proxy = pct.get("proxy")
        check(
            f"Harness CPU vs the gateway's, 512 streams ({label})",
            "≤ 1×",
            harness / proxy if proxy else None,
            1.0,
            "×",
        )
    off, redis = levels.get("off", {}).get("256", {}), levels.get("redis", {}).get("256", {})
    ratio = (
        redis["frames_per_s"] / off["frames_per_s"]
        if redis.get("frames_per_s") and off.get("frames_per_s")
        else None
    )
    check("Redis frames/s vs off, 256 streams", "≥ 0.9×", ratio, 0.9, "×")
    sync, unsync = levels.get("redis", {}), levels.get("redis-async", {})
    for n in ("256", "512"):
        a, b = sync.get(n, {}).get("frames_per_s"), unsync.get(n, {}).get("frames_per_s")
        check(
            f"Durability sync frames/s vs async, {n} streams",
            "≥ 0.95×",
            a / b if a and b else None,
            0.95,
            "×",
        )
    moved = workloads.minus(ttft.get("redis", {}).get("p99"), ttft.get("off", {}).get("p99"))
    check("Redis TTFT p99 moves (vs off)", "≤ 0.5 ms", None if moved is None else abs(moved), 0.5)
    peer = results["stall_free"].get("litellm")
    mine = results["stall_free"].get(ours)
    stall_ratio = mine / peer if mine is not None and peer else None
    check("Stall-free concurrency vs LiteLLM", "≥ 5×", stall_ratio, 5.0, "×")
    for q in ("p50", "p99"):
        theirs = ttft.get("litellm", {}).get(f"added_{q}")
        value = one.get(f"added_{q}") / theirs if theirs and one.get(f"added_{q}") else None
        check(f"Added TTFT {q} vs LiteLLM", "≤ 0.25×", value, 0.25, "×")
    rss = results["resources"].get(ours, {}).get("rss_per_stream_kb")
    check("RSS per concurrent stream", "≤ 64 KB", rss, 64.0, " KB")
    for q in ("p50", "p99"):
        excess = results["seam"].get(ours, {}).get(f"excess_{q}")
        check(f"Seam {q} minus new leg's TTFT {q}", "≤ 5 ms", excess, 5.0, " ms")


def against_notes(results: dict[str, Any], rev: str) -> list[str]:
    """The default gateway next to the same config at ``rev``, measured in the same run."""
    ttft = results.get("ttft", {})  # absent when --only leaves chat out
    ours, theirs = ttft.get("memory", {}), ttft.get("baseline", {})
    notes = [
        f"Against {rev} (same config, same run): added TTFT p50 "
        f"{ours.get('added_p50', 0):+.2f} ms vs {theirs.get('added_p50', 0):+.2f} ms, "
        f"p99 {ours.get('added_p99', 0):+.2f} vs {theirs.get('added_p99', 0):+.2f} ms."
    ]
    for n, row in results.get("concurrency", {}).get("memory", {}).items():
        base = results["concurrency"].get("baseline", {}).get(n)
        if not base or int(n) < 128:
            continue
        cpu = row["cpu_s_per_1000_chunks"] / base["cpu_s_per_1000_chunks"]
        notes.append(
            f"Against {rev}, {n} streams: CPU per delta {cpu:.2f}×; frames/s "
            f"{row['vs_direct']:.3f}× direct vs {base['vs_direct']:.3f}×; TTFT p99 "
            f"{row['ttft_p99']:.1f} vs {base['ttft_p99']:.1f} ms; streams with a gap > 40 ms "
            f"{row['stalled']} vs {base['stalled']} of {row['total_streams']}."
        )
    return notes


def headroom_notes(results: dict[str, Any]) -> list[str]:
    """How busy the harness was: a saturated client or upstream would cap every target."""
    notes, worst = [], (0.0, "", "")
    rounds = [
        (name, n, row)
        for name, rows in results.get("concurrency", {}).items()
        for n, row in rows.items()
    ]
    for key in ("responses", *CHAOS_ROWS):
        paired = results.get(key, {})
        where = " from the chaos upstream" if key in CHAOS_ROWS else ""
        for protocol, rows in paired.get("concurrency", {}).items():
            rounds += [
                (f"{name} ({protocol}{where})", str(paired["streams"]), row)
                for name, row in rows.items()
            ]
    for name, n, row in rounds:
        pct = row["cpu_pct"]
        harness = pct.get("upstream", 0) + pct.get("client", 0) + pct.get("redis", 0)
        worst = max(worst, (harness, name, n))
    notes.append(
        f"Harness headroom: the client, upstream and redis-server together used at most "
        f"{worst[0]:.0f}% of their core (target {worst[1]}, {worst[2]} streams)."
    )
    if worst[0] > HEADROOM:
        notes.append(f"WARNING: above {HEADROOM:.0f}%: the harness may be the bottleneck.")
    return notes


def publish(markdown: str) -> None:
    """Replace the generated section of BENCHMARKS.md (between its markers)."""
    path = ROOT / "BENCHMARKS.md"
    begin, end = "<!-- results: begin -->", "<!-- results: end -->"
    text = path.read_text()
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    if not rest:
        raise SystemExit(f"{path} has no {begin} marker")
    path.write_text(f"{head}{begin}\n{markdown.strip()}\n{end}{tail}")


def main() -> int:
    args = parse_args()
    p = plan(args)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found on PATH")
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    harness_cpu, proxy_cpu = ("0", "1") if pin else (None, None)
    if pin:
        os.sched_setaffinity(0, {0})
    names = ["direct", *GATEWAYS] + (["baseline"] if args.against else [])
    no_litellm = args.no_litellm or "chat" not in args.only  # LiteLLM runs chat's rows only
    names += [] if no_litellm else ["litellm"]
    labels = LABELS | {"baseline": f"gateway at {args.against}, in-memory checkpoints (default)"}
    litellm_exe = None if no_litellm else litellm.ensure(args.litellm_venv)

    started = time.monotonic()
    roles_ = ("bench", "chaos", "redis-server", *names[1:])
    ports = dict(zip(roles_, free_ports(len(roles_)), strict=True))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)
        baseline = stack.enter_context(worktree(args.against)) if args.against else None

        def start(
            name: str, argv: list[str], cpus: str | None, env: dict[str, str] | None = None
        ) -> subprocess.Popen[bytes]:
            return stack.enter_context(spawned(pinned(argv, cpus), env, logs / f"{name}.log"))

        py = sys.executable
        bench = start(
            "bench", [py, "-m", "bench.upstream", "--port", str(ports["bench"])], harness_cpu
        )
        chaos = start(
            "chaos", [str(BIN), "chaos-upstream", "--port", str(ports["chaos"])], harness_cpu
        )
        redis = start(
            "redis-server",
            [
                "redis-server",
                "--port",
                str(ports["redis-server"]),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ]
            + ["--appendonly", "no", "--dir", tmp, "--loglevel", "warning"],
            harness_cpu,
        )
        proxies = {}
        for name in GATEWAYS:
            config = logs / f"{name}.yaml"
            state = STATES[name].format(redis=f"redis://127.0.0.1:{ports['redis-server']}/0")
            config.write_text(
                GATEWAY_CONFIG.format(bench=ports["bench"], chaos=ports["chaos"], state=state)
            )
            argv = [str(BIN), "serve", "--config", str(config), "--port", str(ports[name])]
            if args.workers:
                argv += ["--workers", str(args.workers)]
            proxies[name] = start(name, [*argv, "--log-level", "warning"], proxy_cpu)
        if baseline is not None:
            # The same config as ``memory``, the code from the worktree (-P: not this tree's).
            argv = [py, "-P", "-m", "gateway", "serve", "--config", str(logs / "memory.yaml")]
            argv += ["--port", str(ports["baseline"]), "--log-level", "warning"]
            if args.workers:
                argv += ["--workers", str(args.workers)]
            env = os.environ | {"PYTHONPATH": str(baseline)}
            proxies["baseline"] = start("baseline", argv, proxy_cpu, env)
        if litellm_exe is not None:
            config = logs / "litellm.yaml"
            config.write_text(
                litellm.config(f"http://127.0.0.1:{ports['bench']}/v1", workloads.MODELS)
            )
            env = os.environ | litellm.ENV
            argv = litellm.command(litellm_exe, config, ports["litellm"])
            proxies["litellm"] = start("litellm", argv, proxy_cpu, env)
        # Everything spawned before any probe: a probe's outgoing connection takes an
        # ephemeral port, which could be one a process has yet to bind.
        wait_ready(
            redis, redis_ok(ports["redis-server"]), "redis-server", log=logs / "redis-server.log"
        )
        wait_ready(bench, http_ok(f"http://127.0.0.1:{ports['bench']}/v1/models"), "bench upstream")
        wait_ready(chaos, http_ok(f"http://127.0.0.1:{ports['chaos']}/v1/models"), "chaos upstream")
        for name, proc in proxies.items():
            path = litellm.READY_PATH if name == "litellm" else "/readyz"
            probe = http_ok(f"http://127.0.0.1:{ports[name]}{path}")
            wait_ready(proc, probe, name, timeout=120, log=logs / f"{name}.log")
        ready = time.monotonic()

        targets = [Target("direct", ports["bench"])]
        for name, proc in proxies.items():
            targets.append(
                Target(
                    name, ports[name], tree(proc.pid), litellm.HEADERS if name == "litellm" else {}
                )
            )
        roles = Roles(
            redis_port=ports["redis-server"],
            upstream=[bench.pid],
            redis=[redis.pid],
            chaos=[chaos.pid],
            everything=[
                os.getpid(),
                bench.pid,
                chaos.pid,
                redis.pid,
                *(pid for t in targets for pid in t.proxy),
            ],
        )
        results = uvloop.run(measure(targets, Target("chaos", ports["chaos"]), roles, p))

    results["configs"] = names
    results["labels"] = {name: labels[name] for name in names}
    results["targets"] = targets_met(results)
    against = against_notes(results, args.against) if args.against else []
    now = datetime.datetime.now(datetime.UTC)
    command = "python -m bench " + shlex.join(sys.argv[1:])
    results["meta"] = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": command.strip(),
        "quick": args.quick,
        "machine": machine(),
        "commit": commit(),
        "pinning": (
            "harness (client, upstreams, redis-server) on CPU 0; each proxy on CPU 1"
            if pin
            else "none"
        ),
        "workers": args.workers or "serve's default (1 per CPU it may use with Redis, else 1)",
        "litellm": None if no_litellm else litellm.VERSION,
        "plan": p,
        "runtime_s": time.monotonic() - started,
        "startup_s": ready - started,
        "notes": headroom_notes(results) + against,
    }
    out = args.out or ROOT / "bench" / "results" / ("quick" if args.quick else "")
    paths = report.write(results, out)
    markdown = report.markdown(results)
    print(markdown)
    print("\nwrote " + ", ".join(str(path) for path in paths))
    if args.publish:
        publish(markdown)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # the processes are already cleaned up
        raise SystemExit(130) from None
