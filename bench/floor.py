"""The floor under the gateway's CPU per delta: what its stack costs with nothing on top.

    .venv/bin/python -m bench.floor                        # 512 streams, 3 rounds
    .venv/bin/python -m bench.floor --streams 256 --rounds 5

Four targets, side by side in rotating rounds, on the concurrency workload of
``python -m bench`` (N streams of 64 deltas 20 ms apart, all started at once):

- ``direct``: the client to the bench upstream;
- ``pipe``: a byte pipe, one upstream connection per client connection, each read
  written on at once (uvloop protocols, no HTTP): the least a proxy in Python on
  uvloop costs per delta;
- ``asgi``: uvicorn as the gateway runs it (httptools, uvloop) with a bare ASGI app
  that sends the request body upstream through the gateway's own HTTP/1.1 engine
  and relays the upstream's body chunks unparsed: no Starlette, no JSON, no run,
  no log, no follower. The stack the gateway is built on, alone;
- ``gateway``: the default gateway (in-memory checkpoints).

Each proxy is one process pinned to CPU 1, the harness (client, upstream) to CPU 0,
as in ``python -m bench``. Reported per target: CPU µs per relayed delta (its CPU
over the rounds divided by the deltas, so request starts are in it), frames/s
against direct's, streams with a gap over 40 ms, errors and TTFT p99. The
gateway's figure less the ``asgi`` one is what the gateway's own work costs: the
part a change to the gateway can move (BENCHMARKS.md, "The floor").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import httpx2
import uvicorn
import uvloop
from starlette.types import Message, Receive, Scope, Send

from bench import workloads
from bench.procs import free_ports, http_ok, pinned, spawned, tree, wait_ready
from bench.starts import CONFIG  # the default gateway, every model to the bench upstream
from bench.workloads import Roles, Target
from gateway.upstream import transport as http1
from gateway.upstream.sse import event_stream

TARGETS = ("direct", "pipe", "asgi", "gateway")


# -- the byte pipe ------------------------------------------------------------------------


class _UpstreamSide(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.close()


class _ClientSide(asyncio.Protocol):
    """A client connection, piped to an upstream connection of its own."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream_address = upstream
        self._upstream: asyncio.Transport | None = None
        self._early: list[bytes] = []  # what the client sent before the pipe was up
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._client = cast(asyncio.Transport, transport)  # uvloop's do not subclass it
        self._connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(
            lambda: _UpstreamSide(self._client), *self._upstream_address
        )
        if self._closed:
            upstream.close()
            return
        self._upstream = upstream
        for data in self._early:
            upstream.write(data)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        if self._upstream is None:
            self._early.append(data)
        else:
            self._upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._upstream is not None:
            self._upstream.close()


async def serve_pipe(port: int, upstream: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _ClientSide(("127.0.0.1", upstream)), "127.0.0.1", port, backlog=4096
    )
    await server.serve_forever()


# -- the bare ASGI app --------------------------------------------------------------------


class Relay:
    """An ASGI app: each request's body to the upstream, its body chunks back unparsed."""

    def __init__(self, upstream: int) -> None:
        self._url = httpx2.URL(f"http://127.0.0.1:{upstream}/v1/chat/completions")
        self._engine: tuple[http1.Http1Transport, http1.Target] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["method"] == "GET":  # the readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if self._engine is None:  # made on the server's loop; the target once, as the gateway
            engine = http1.Http1Transport(
                tls=ssl.create_default_context(),
                max_connections=4096,
                max_keepalive_connections=4096,
            )
            self._engine = engine, engine.target("POST", self._url)
        engine, target = self._engine
        body = bytearray()
        message: Message = {"more_body": True}
        while message.get("more_body"):
            message = await receive()
            body += message.get("body", b"")
        headers = {"content-type": "application/json"}
        response = await engine.request(target, headers, bytes(body), {"read": 30.0})
        start = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": start})
        try:
            async for chunk in event_stream(response):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await response.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return


def serve_asgi(port: int, upstream: int) -> None:
    uvicorn.run(
        Relay(upstream),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        backlog=4096,
    )


# -- the measurement ----------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--streams", type=int, default=512, help="concurrent streams")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per target")
    parser.add_argument("--serve", choices=("pipe", "asgi"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def measure(streams: int, rounds: int) -> dict[str, dict[str, Any]]:
    os.sched_setaffinity(0, {0})
    py = sys.executable
    ports = dict(zip(TARGETS, free_ports(len(TARGETS)), strict=True))
    upstream = ports["direct"]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)

        def start(name: str, argv: list[str], cpus: str) -> subprocess.Popen[bytes]:
            return stack.enter_context(spawned(pinned(argv, cpus), None, logs / f"{name}.log"))

        bench = start("bench", [py, "-m", "bench.upstream", "--port", str(upstream)], "0")
        proxies = {}
        for name in ("pipe", "asgi"):
            argv = [py, "-m", "bench.floor", "--serve", name, "--port", str(ports[name])]
            proxies[name] = start(name, [*argv, "--upstream", str(upstream)], "1")
        config = logs / "gateway.yaml"
        config.write_text(CONFIG.format(port=upstream))
        argv = [py, "-m", "gateway", "serve", "--config", str(config)]
        argv += ["--port", str(ports["gateway"]), "--log-level", "warning"]
        proxies["gateway"] = start("gateway", argv, "1")
        wait_ready(bench, http_ok(f"http://127.0.0.1:{upstream}/v1/models"), "bench upstream")
        for name, proc in proxies.items():
            # Through the pipe, /v1/models is the upstream's; the bare app answers any GET.
            path = "/readyz" if name == "gateway" else "/v1/models"
            probe = http_ok(f"http://127.0.0.1:{ports[name]}{path}")
            wait_ready(proc, probe, name, timeout=60, log=logs / f"{name}.log")
        targets = [Target("direct", upstream)]
        targets += [Target(name, ports[name], tree(proc.pid)) for name, proc in proxies.items()]
        roles = Roles(
            upstream=[bench.pid],
            redis=[],
            everything=[os.getpid(), bench.pid, *(p for t in targets for p in t.proxy)],
        )
        table = workloads.measure_concurrency(targets, [streams], rounds, roles)
    return {name: rows[str(streams)] for name, rows in table.items()}


def markdown(rows: dict[str, dict[str, Any]], streams: int, rounds: int) -> str:
    lines = [
        f"{streams} streams of {workloads.CHUNKS} deltas {workloads.PACE_MS} ms apart, "
        f"{rounds} rounds per target",
        "",
        "| target | CPU µs per delta | frames/s × direct | streams stalled | errors | TTFT p99 |",
        "| :-- | --: | --: | --: | --: | --: |",
    ]
    for name in TARGETS:
        row = rows[name]
        cpu = "" if name == "direct" else f"{row['cpu_s_per_1000_chunks'] * 1000:.1f}"
        ttft = row["ttft_p99"]
        lines.append(
            f"| {name} | {cpu} | {row['vs_direct']:.3f} | "
            f"{row['stalled']} of {row['total_streams']} | {row['errors']} | "
            f"{'' if ttft is None else f'{ttft:.1f} ms'} |"
        )
    own = rows["gateway"]["cpu_s_per_1000_chunks"] - rows["asgi"]["cpu_s_per_1000_chunks"]
    lines += ["", f"The gateway's own work: {own * 1000:.1f} µs per delta above the asgi floor."]
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    if args.serve == "pipe":
        uvloop.run(serve_pipe(args.port, args.upstream))
        return 0
    if args.serve == "asgi":
        serve_asgi(args.port, args.upstream)
        return 0
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench.floor pins the proxies and the harness to two CPUs")
    rows = measure(args.streams, args.rounds)
    print(markdown(rows, args.streams, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
