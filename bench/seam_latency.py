"""Seam latency: from an upstream fault to the first spliced delta the client receives.

    .venv/bin/python -m bench.seam_latency --recoveries 200

Runs the chaos upstream and the gateway as separate processes (the real CLI), with
retry backoff configured to 0, so what is measured is detection + the new leg's
time to first byte + the gateway's own work. Side by side, in the same run, it
measures the baseline: the chaos upstream's time to the first content delta of
the same continuation request, sent directly. Each stream is 40 text deltas
written at once, reset (TCP RST) after the 20th; the seam is the gap between
the 20th and 21st content delta the client receives.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

from gateway.chaos import expected_answer

BIN = Path(sys.executable).with_name("resumable-gateway")
CONFIG = """
upstreams:
  - name: chaos
    base_url: http://127.0.0.1:{chaos}/v1
    timeouts: {{connect: 2, first_byte: 5, idle: 5}}
routes:
  - match: "*"
    upstream: chaos
    retry: {{retries: 2, backoff_initial: 0, backoff_max: 0, idle_retry_delay: 0}}
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def process(args: list[str], probe: str) -> Iterator[None]:
    proc = subprocess.Popen([str(BIN), *args], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(probe).raise_for_status()
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def content_times(client: httpx.Client, url: str, body: dict[str, object]) -> list[float]:
    """Arrival time of each content-bearing chunk; asserts nothing broke."""
    times = []
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content":"' in line.replace(": ", ":"):
                chunk = orjson.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    times.append(time.perf_counter())
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recoveries", type=int, default=200)
    args = parser.parse_args()
    chaos_port, gateway_port = free_port(), free_port()
    chaos = f"http://127.0.0.1:{chaos_port}/v1"
    gateway = f"http://127.0.0.1:{gateway_port}/v1"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
        config.write(CONFIG.format(chaos=chaos_port))
        config.flush()
        with (
            process(["chaos-upstream", "--port", str(chaos_port)], chaos + "/models"),
            process(
                ["serve", "--config", config.name, "--port", str(gateway_port)],
                gateway.removesuffix("/v1") + "/healthz",
            ),
            httpx.Client(timeout=30) as client,
        ):
            seams, direct = [], []
            for i in range(args.recoveries):
                model = f"chaos:text=40,seed={i},fault=reset,at=20,times=1"
                answer = expected_answer(model).text
                # Alternate the two measurements to cancel machine drift.
                times = content_times(
                    client,
                    gateway + "/chat/completions",
                    {"model": model, "messages": [], "stream": True},
                )
                if len(times) < 21:
                    raise SystemExit(f"stream {i} did not recover: {len(times)} deltas")
                seams.append(times[20] - times[19])
                prefix = answer[: len(answer) // 2]  # any prefix of the answer will do
                started = time.perf_counter()
                first = content_times(
                    client,
                    chaos + "/chat/completions",
                    {
                        "model": f"chaos:text=40,seed={i}",
                        "messages": [
                            {"role": "assistant", "content": prefix},
                            {"role": "user", "content": "continue"},
                        ],
                        "stream": True,
                    },
                )[0]
                direct.append(first - started)
    ms = 1000
    seam_p50, seam_p99 = statistics.median(seams) * ms, percentile(seams, 0.99) * ms
    ttft_p50, ttft_p99 = statistics.median(direct) * ms, percentile(direct, 0.99) * ms
    print(f"recoveries: {len(seams)} (reset after 20 of 40 deltas, backoff 0)")
    print("| | p50 (ms) | p99 (ms) |\n|---|---|---|")
    print(f"| seam: fault -> first spliced delta at the client | {seam_p50:.2f} | {seam_p99:.2f} |")
    print(f"| new leg's TTFT, continuation sent directly | {ttft_p50:.2f} | {ttft_p99:.2f} |")
    print(f"| seam minus new leg's TTFT | {seam_p50 - ttft_p50:.2f} | {seam_p99 - ttft_p99:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
