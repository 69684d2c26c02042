"""What tracing costs the relay (issue 31): off, sampled at 10%, and at 100%.

    .venv/bin/python -m bench.tracing                          # 256 and 512 streams
    .venv/bin/python -m bench.tracing --streams 128 --rounds 5

Three gateways on one upstream, in one run:

- ``off``: the default (no ``tracing:``, no ``OTEL_*``);
- ``sampled``: tracing on, ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0.1:
  one run in ten exports its spans (every upstream request still gets a
  ``traceparent``);
- ``all``: tracing on with the SDK's default sampler, ``parentbased_always_on``:
  every run exports a run span and a span per upstream request.

Each exports over OTLP/HTTP to a sink (an HTTP server that decodes each export
request and counts its spans, as a collector would receive them). The workload is
``python -m bench``'s concurrency workload (N streams of 64 deltas 20 ms apart, all
started at once) in rotating rounds beside ``direct``, each proxy pinned to CPU 1,
the harness, the upstream and the sink to CPU 0. Reported per N: frames/s and its
ratio to ``off``, the added latency per event at p50 and p99, CPU per delta (the
proxy's whole process, the exporter's thread included) and its ratio to ``off``,
TTFT p99, stalled streams; and the spans the sink received from each gateway.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import orjson

from bench import workloads
from bench.procs import free_ports, http_ok, pinned, spawned, wait_ready
from bench.starts import CONFIG
from bench.workloads import Roles, gateway_targets

SAMPLERS = {
    "sampled": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
    "all": {},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    parser.add_argument("--streams", default="256,512", help="concurrency levels")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per level")
    parser.add_argument("--sink", type=int, help=argparse.SUPPRESS)  # run as the sink
    return parser.parse_args()


def sink(port: int) -> None:
    """An OTLP/HTTP trace receiver that counts spans by service name: ``GET /spans``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    counts: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = ExportTraceServiceRequest.FromString(body)
            with lock:
                for resource_spans in request.resource_spans:
                    service = next(
                        kv.value.string_value
                        for kv in resource_spans.resource.attributes
                        if kv.key == "service.name"
                    )
                    spans = sum(len(scope.spans) for scope in resource_spans.scope_spans)
                    counts[service] = counts.get(service, 0) + spans
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            with lock:
                body = orjson.dumps(counts)
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def measure(levels: list[int], rounds: int) -> tuple[dict[str, Any], dict[str, int]]:
    os.sched_setaffinity(0, {0})
    roles_ = ("upstream", "sink", "off", "sampled", "all")
    ports = dict(zip(roles_, free_ports(len(roles_)), strict=True))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)

        def start(
            name: str, argv: list[str], cpus: str, env: dict[str, str] | None = None
        ) -> subprocess.Popen[bytes]:
            return stack.enter_context(spawned(pinned(argv, cpus), env, logs / f"{name}.log"))

        py = sys.executable
        upstream = start(
            "upstream", [py, "-m", "bench.upstream", "--port", str(ports["upstream"])], "0"
        )
        collector = start("sink", [py, "-m", "bench.tracing", "--sink", str(ports["sink"])], "0")
        config = logs / "gateway.yaml"
        config.write_text(CONFIG.format(port=ports["upstream"]))
        proxies = {}
        for name in ("off", "sampled", "all"):
            env = dict(os.environ)
            if name != "off":
                env |= SAMPLERS[name] | {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['sink']}",
                    "OTEL_SERVICE_NAME": name,
                }
            argv = [py, "-m", "gateway", "serve", "--config", str(config), "--workers", "1"]
            argv += ["--port", str(ports[name]), "--log-level", "warning"]
            proxies[name] = start(name, argv, "1", env)
        wait_ready(upstream, http_ok(f"http://127.0.0.1:{ports['upstream']}/v1/models"), "upstream")
        wait_ready(collector, http_ok(f"http://127.0.0.1:{ports['sink']}/spans"), "sink")
        targets = gateway_targets(ports["upstream"], proxies, ports, logs, timeout=60)
        roles = Roles(
            upstream=[upstream.pid],
            redis=[],
            everything=[
                os.getpid(),
                upstream.pid,
                collector.pid,
                *(p for t in targets for p in t.proxy),
            ],
        )
        table = workloads.measure_concurrency(targets, levels, rounds, roles)
        for proc in proxies.values():  # SIGTERM: each exports what it still holds
            proc.terminate()
            proc.wait(30)
        spans: dict[str, int] = orjson.loads(
            httpx2.get(f"http://127.0.0.1:{ports['sink']}/spans", timeout=5).content
        )
        return table, spans


def markdown(table: dict[str, Any], levels: list[int], rounds: int, spans: dict[str, int]) -> str:
    lines = [
        f"N streams of {workloads.CHUNKS} deltas {workloads.PACE_MS} ms apart, {rounds} rounds "
        "per target and N; latency: added to direct's, per event",
        "",
        "| N | tracing | frames/s | × off | latency p50 | p99 | CPU µs / delta | × off "
        "| TTFT p99 | stalled | errors |",
        "| --: | :-- | --: | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    labels = {"off": "off (default)", "sampled": "on, 10% sampled", "all": "on, 100% (default)"}
    for n in levels:
        direct = table["direct"][str(n)]
        base = table["off"][str(n)]
        for name in ("off", "sampled", "all"):
            row = table[name][str(n)]
            cpu = row["cpu_s_per_1000_chunks"] * 1000
            lines.append(
                f"| {n} | {labels[name]} | {row['frames_per_s']:.0f} | "
                f"{row['frames_per_s'] / base['frames_per_s']:.3f} | "
                f"{row['lateness_p50'] - direct['lateness_p50']:+.2f} ms | "
                f"{row['lateness_p99'] - direct['lateness_p99']:+.2f} ms | "
                f"{cpu:.1f} | {cpu / (base['cpu_s_per_1000_chunks'] * 1000):.3f} | "
                f"{row['ttft_p99']:.1f} ms | "
                f"{row['stalled']} of {row['total_streams']} | {row['errors']} |"
            )
    lines += [
        "",
        "Spans the sink received: "
        + ", ".join(f"{name} {spans.get(name, 0)}" for name in ("off", "sampled", "all"))
        + ".",
    ]
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    if args.sink is not None:
        sink(args.sink)
        return 0
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench.tracing pins the proxies and the harness to two CPUs")
    levels = [int(n) for n in args.streams.split(",")]
    table, spans = measure(levels, args.rounds)
    print(markdown(table, levels, args.rounds, spans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
