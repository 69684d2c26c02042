"""An abuse suite: hostile clients and upstreams against a real gateway, with its RSS and fds.

    .venv/bin/python -m probes.abuse                 # full sizes (200 MB lines, 2,200 slow sockets)
    .venv/bin/python -m probes.abuse --quick         # small sizes for CI, well under a minute
    .venv/bin/python -m probes.abuse --quick --only 2,7 --out /tmp/abuse

It starts its own processes (``bench.procs``): the chaos upstream
(``resumable-gateway chaos-upstream``), and for each probe a fresh gateway
(``resumable-gateway serve --config FILE --port P``; a process whose heap grew
and was freed in one probe would hide the next one's growth) whose upstreams
carry a known ``api_key``: base URLs ending in ``/v1`` (the chaos upstream for
pass-through, the raw one for ``raw-*`` models), or, for probe 1b, a base URL
without a path. In this process run a scripted raw upstream
(``probes.abuse.upstream``: bytes the chaos upstream cannot send) and a *victim*
listener that no config names. Each probe (ARCHITECTURE.md section 6a) runs while
the gateway's RSS is sampled every 50 ms (``/proc/PID/status``) and its open
descriptors are counted:

1. SSRF paths (``probes.abuse.inbound``) against both gateways;
2. a huge SSE line without an end, five times;
3. clients that read the headers of a fast, large stream and then nothing;
4. invalid UTF-8 in content deltas;
5. a huge request head;
6. slowloris: half-sent heads, trickled bodies, connections that send nothing;
7. a non-streaming client that leaves mid-answer;
8. an upstream whose 401 and error event echo its key (and a search of the logs);
9. malformed requests.

Every row says what was sent, what the client saw, RSS before / peak / after,
descriptors before / after, what reached the upstreams (requests, and bytes the
upstream managed to write where that is the point) and the victim. The table
goes to stdout; ``abuse.json``, ``abuse.md`` and the processes' logs to ``--out``.
The exit status is 1 when any probe's expectation failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.procs import commit, free_ports, http_ok, machine, spawned, wait_ready, write_report
from probes.abuse.inbound import probe_big_header, probe_malformed, probe_slowloris, probe_ssrf
from probes.abuse.lab import BIN, SECRET, Lab, Limits, ProbeResult, Sizes
from probes.abuse.net import RawUpstream, Victim, raised_fd_limit, socket_inodes
from probes.abuse.streams import (
    probe_disconnect,
    probe_huge_line,
    probe_invalid_utf8,
    probe_key_echo,
    probe_never_read,
)
from probes.abuse.upstream import RawAnswers

KEY_ENV = "ABUSE_UPSTREAM_KEY"  # the configs say ${ABUSE_UPSTREAM_KEY}: no key in a file
UPSTREAM_SEND_BUFFER = 128 * 1024  # the raw upstream's SO_SNDBUF: back-pressure shows early

CONFIG_HEAD = """
listen:
  drain_timeout: 1
  header_timeout: {limits.header_timeout}
  body_timeout: {limits.body_timeout}
state:
  detach_grace: {limits.detach_grace}
logging:
  format: json
upstreams:
"""
UPSTREAM = """
  - name: {name}
    base_url: {base_url}
    api_key: ${{{key_env}}}
    timeouts: {{connect: 2, first_byte: 10, idle: 10}}
"""
ROUTES = """
routes:
  - match: "raw-*"
    upstream: raw
    retry: {retry}
  - match: "*"
    upstream: chaos
    retry: {retry}
"""
RETRY = "{retries: 1, backoff_initial: 0.05, backoff_max: 0.1, idle_retry_delay: 0}"


def gateway_config(limits: Limits, upstreams: dict[str, str]) -> str:
    """A gateway's YAML: ``upstreams`` maps names to base URLs; two get the routes."""
    text = CONFIG_HEAD.format(limits=limits)
    for name, base_url in upstreams.items():
        text += UPSTREAM.format(name=name, base_url=base_url, key_env=KEY_ENV)
    if len(upstreams) > 1:
        text += ROUTES.format(retry=RETRY)
    return text


# Run order: 8 last, so its search of the logs covers every other probe's gateway.
PROBES: list[tuple[str, Callable[[Lab], ProbeResult]]] = [
    ("1a", lambda lab: probe_ssrf(lab, "main", "1a")),
    ("1b", lambda lab: probe_ssrf(lab, "nopath", "1b")),
    ("2", probe_huge_line),
    ("3", probe_never_read),
    ("4", probe_invalid_utf8),
    ("5", probe_big_header),
    ("6", probe_slowloris),
    ("7", probe_disconnect),
    ("9", probe_malformed),
    ("8", probe_key_echo),
]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m probes.abuse", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and counts (CI)")
    parser.add_argument("--out", type=Path, help="report and logs (default: a new temp dir)")
    parser.add_argument(
        "--only", help="comma-separated probe numbers to run (e.g. 2,7; 1 means 1a and 1b)"
    )
    args = parser.parse_args(argv)
    if args.only:
        wanted = {part.strip() for part in args.only.split(",")}
        known = {number.rstrip("ab") for number, _ in PROBES}
        if not wanted <= known:
            parser.error(f"unknown probes {sorted(wanted - known)}; known: {sorted(known)}")
    return args


def selected(only: str | None) -> list[tuple[str, Callable[[Lab], ProbeResult]]]:
    if not only:
        return PROBES
    wanted = {part.strip() for part in only.split(",")}
    return [(n, probe) for n, probe in PROBES if n.rstrip("ab") in wanted]


def run_probe(lab: Lab, number: str, probe: Callable[[Lab], ProbeResult]) -> ProbeResult:
    print(f"probe {number} …", file=sys.stderr, flush=True)
    try:
        return probe(lab)
    except Exception as exc:  # noqa: BLE001 - a probe that crashed is a failed probe
        result = ProbeResult(number, "(crashed)", "", "")
        result.failures.append(f"the probe raised {type(exc).__name__}: {exc}")
        return result


# -- the report ---------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"## Abuse suite ({'quick' if meta['quick'] else 'full'}): "
        f"{report['passed']}/{len(report['probes'])} probes met their expectation",
        "",
        "| # | probe | sent | client saw | RSS MB before / peak / after | fds before → after "
        "| reached the upstream | victim / key leaked | expectation | result |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["probes"]:
        upstream = f"{p['upstream_requests']} req"
        if p["upstream_bytes"] is not None:
            upstream += f", {p['upstream_bytes'] / 2**20:.1f} MB written"
        leaks = f"{p['victim_contacts']} / {'YES' if p['secret_leaked'] else 'no'}"
        verdict = "pass" if p["passed"] else "**FAIL**"
        rss = f"{p['rss_before_mb']} / {p['rss_peak_mb']} / {p['rss_after_mb']}"
        cells = [
            p["number"],
            p["name"],
            p["sent"],
            p["outcome"],
            rss,
            f"{p['fds_before']} → {p['fds_after']}",
            upstream,
            leaks,
            p["expectation"],
            verdict,
        ]
        lines.append("| " + " | ".join(_cell(str(c)) for c in cells) + " |")
    failed = [p for p in report["probes"] if not p["passed"]]
    if failed:
        lines += ["", "Failed expectations:"]
        for p in failed:
            lines += [f"- {p['number']} ({p['name']}): {f}" for f in p["failures"][:8]]
    lines += [
        "",
        f"{meta['runtime_s']:.1f} s; `{meta['command']}`; commit {meta['commit']}; "
        f"{meta['machine']}.",
    ]
    return "\n".join(lines)


def build_report(
    args: argparse.Namespace, results: list[ProbeResult], started: float
) -> dict[str, Any]:
    ordered = sorted(results, key=lambda r: (r.number.rstrip("ab").zfill(3), r.number))
    return {
        "meta": {
            "command": "python -m probes.abuse " + shlex.join(sys.argv[1:]),
            "quick": args.quick,
            "sizes": vars(Sizes.of(args.quick)),
            "limits": vars(Limits()),
            "runtime_s": time.monotonic() - started,
            "commit": commit(),
            "machine": machine(),
        },
        "passed": sum(r.passed for r in ordered),
        "failed": [r.number for r in ordered if not r.passed],
        "probes": [r.as_dict() for r in ordered],
    }


# -- main ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="abuse-"))
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    sizes, limits = Sizes.of(args.quick), Limits()
    answers = RawAnswers(sizes.huge_line, sizes.flood_bytes)
    env = os.environ | {KEY_ENV: SECRET}
    results: list[ProbeResult] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(raised_fd_limit())
        raw = stack.enter_context(RawUpstream(answers, send_buffer=UPSTREAM_SEND_BUFFER))
        victim = stack.enter_context(Victim())
        (chaos_port,) = free_ports(1)
        chaos_log = logs / "chaos-upstream.log"
        chaos_argv = [str(BIN), "chaos-upstream", "--port", str(chaos_port)]
        chaos = stack.enter_context(spawned(chaos_argv, log=chaos_log))
        raw_url, chaos_url = f"http://127.0.0.1:{raw.port}", f"http://127.0.0.1:{chaos_port}"
        configs = {"main": logs / "gateway-main.yaml", "nopath": logs / "gateway-nopath.yaml"}
        configs["main"].write_text(
            gateway_config(limits, {"raw": raw_url + "/v1", "chaos": chaos_url + "/v1"})
        )
        configs["nopath"].write_text(gateway_config(limits, {"raw": raw_url}))
        ready = http_ok(f"http://127.0.0.1:{chaos_port}/v1/models")
        wait_ready(chaos, ready, "chaos-upstream", log=chaos_log)
        time.sleep(0.3)  # the readiness probe's connection to the chaos upstream is closed
        lab = Lab(
            args.quick,
            sizes,
            limits,
            configs,
            env,
            chaos_port,
            chaos.pid,
            socket_inodes(chaos.pid),
            raw,
            victim,
            logs,
        )
        for number, probe in selected(args.only):
            results.append(run_probe(lab, number, probe))
    report = build_report(args, results, started)
    write_report(out, "abuse", report, markdown(report), logs)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # the processes are already cleaned up
        raise SystemExit(130) from None
