"""A real deployment in miniature, and a minute of traffic through it for the dashboard.

Processes, as ``tests/processes.py`` starts them: a redis-server (when one is installed;
else the gateways keep state in memory), the chaos upstream (``resumable-gateway
chaos-upstream``) and two gateway replicas (``resumable-gateway serve``) sharing the
Redis. Then clients stream through both replicas for ``DURATION`` seconds: clean answers
most of the time, and in the middle third a provider incident (resets, stalls, error
events, truncations, 500s, half-written tool calls, answers that cannot be saved, an
upstream that is down and whose circuit opens), with Responses and Messages streams,
resumes on either replica, clients that leave, and WebSockets throughout.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import orjson
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import connect

BIN = str(Path(sys.executable).with_name("resumable-gateway"))
DURATION = 60.0  # seconds of traffic
INCIDENT = (20.0, 40.0)  # when the provider misbehaves
WORKERS = 4  # concurrent clients
PACE = "pace_ms=15"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}

CONFIG = """
upstreams:
  - name: chaos
    base_url: http://127.0.0.1:{chaos}/v1
    timeouts: {{connect: 2, first_byte: 5, idle: 0.5}}
    continuation_models: {{"*prefill=0*": prefix}}
  - name: chaos-anthropic
    kind: anthropic
    base_url: http://127.0.0.1:{chaos}
    timeouts: {{connect: 2, first_byte: 5, idle: 0.5}}
  - name: flaky  # nothing listens there: its circuit opens, its fallback answers
    base_url: http://127.0.0.1:{dead}/v1
    timeouts: {{connect: 0.5, first_byte: 1, idle: 1}}
    circuit: {{failures: 2, cooldown: 4}}
routes:
  - match: "flaky:*"
    upstream: flaky
    retry: {{retries: 1, backoff_initial: 0.05, backoff_max: 0.1}}
    fallbacks: [{{upstream: chaos, model: "chaos:text=40,seed=77,{pace}"}}]
  - match: "*"
    upstream: chaos-anthropic
    retry: {{retries: 2, backoff_initial: 0.05, backoff_max: 0.2, idle_retry_delay: 0}}
  - match: "*"
    upstream: chaos
    retry: {{retries: 2, backoff_initial: 0.05, backoff_max: 0.2, idle_retry_delay: 0}}
state:
{state}
websocket: {{max_connections: 2}}
logging: {{level: error}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_until_up(url: str, process: subprocess.Popen[bytes], deadline: float = 20.0) -> None:
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with contextlib.suppress(httpx2.HTTPError):
            if httpx2.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {deadline} s")


@dataclass(frozen=True)
class Deployment:
    replicas: dict[str, str]  # instance name -> http://127.0.0.1:PORT
    redis: bool


@contextlib.contextmanager
def deployment() -> Iterator[Deployment]:
    """Redis (if installed), the chaos upstream and replicas a and b, torn down after."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(process)
        return process

    try:
        with tempfile.TemporaryDirectory() as directory:
            state = "  detach_grace: 0.5\n"
            redis = shutil.which("redis-server")
            if redis:
                port = free_port()
                start(redis, "--port", str(port), "--save", "", "--appendonly", "no")
                state += f"  redis_url: redis://127.0.0.1:{port}/0\n  lease_ttl: 2\n"
            chaos = free_port()
            upstream = start(BIN, "chaos-upstream", "--port", str(chaos))
            _wait_until_up(f"http://127.0.0.1:{chaos}/v1/models", upstream)
            config = Path(directory) / "gateway.yaml"
            config.write_text(CONFIG.format(chaos=chaos, dead=free_port(), pace=PACE, state=state))
            replicas = {}
            for name in ("replica-a", "replica-b"):
                port = free_port()
                serve = ("serve", "--config", str(config), "--port", str(port), "--workers", "1")
                replica = start(BIN, *serve)
                replicas[name] = f"http://127.0.0.1:{port}"
                _wait_until_up(replicas[name] + "/readyz", replica)
            yield Deployment(replicas, bool(redis))
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


# -- the clients ---------------------------------------------------------------------

_serial = itertools.count(1)
MESSAGES = [{"role": "user", "content": "Tell me about recovery."}]


def _chat(client: httpx2.Client, url: str, model: str, usage: bool = True) -> None:
    body: dict[str, object] = {"model": model, "messages": MESSAGES, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        for _ in response.iter_bytes():
            pass


def _responses(client: httpx2.Client, url: str, model: str) -> None:
    body = {"model": model, "input": "Tell me about recovery.", "stream": True}
    with client.stream("POST", url + "/v1/responses", json=body) as response:
        for _ in response.iter_bytes():
            pass


def _messages(client: httpx2.Client, url: str, model: str) -> None:
    body = {"model": model, "max_tokens": 4096, "messages": MESSAGES, "stream": True}
    with client.stream("POST", url + "/v1/messages", json=body) as response:
        for _ in response.iter_bytes():
            pass


def _resume(client: httpx2.Client, url: str, other: str, model: str) -> None:
    """An answer read whole, then asked again from event 3, here and on the other replica."""
    body = {"model": model, "messages": MESSAGES, "stream": True}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        run_id = response.headers["x-run-id"]
        for _ in response.iter_bytes():
            pass
    for where in (url, other):
        headers = {"x-run-id": run_id, "x-resume-from": "3"}
        with client.stream(
            "POST", where + "/v1/chat/completions", json=body, headers=headers
        ) as again:
            for _ in again.iter_bytes():
                pass


def _leave(client: httpx2.Client, url: str, model: str) -> None:
    """A client that reads a little and goes: its run detaches, then is cancelled."""
    body = {"model": model, "messages": MESSAGES, "stream": True}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        for index, _ in enumerate(response.iter_bytes()):
            if index == 3:
                break


def _fault() -> str:
    n = next(_serial)
    fault = random.choice(
        [
            "fault=reset,at=20,times=1",
            "fault=stall,at=25,times=1",
            "fault=error,at=15,times=1",
            "fault=no_finish,at=30,times=1",
            "fault=malformed,at=10,times=1",
            "fault=http_500,times=1",
            "prefill=0,fault=reset,at=8,times=1",
        ]
    )
    return f"chaos:text=60,usage=1,seed={1000 + n},{PACE},{fault}"


def _one_request(client: httpx2.Client, urls: list[str], t: float) -> None:
    """What one client does next, ``t`` seconds into the run."""
    n = next(_serial)
    url, other = urls[n % 2], urls[(n + 1) % 2]
    clean = f"chaos:text=60,usage=1,seed={n},{PACE}"
    incident = INCIDENT[0] <= t < INCIDENT[1]
    roll = random.random()
    if roll < 0.08:
        _resume(client, url, other, clean)
    elif roll < 0.12:
        _leave(client, url, f"chaos:text=200,seed={n},pace_ms=50")
    elif roll < 0.22:
        _responses(client, url, _fault() if incident else clean)
    elif roll < 0.32:
        _messages(client, url, _fault() if incident else clean)
    elif not incident:
        _chat(client, url, clean if roll < 0.97 else _fault())
    elif roll < 0.45:
        _chat(client, url, f"flaky:{n}")
    elif roll < 0.48:  # a reset at every attempt: the answer cannot be saved
        _chat(client, url, f"chaos:text=30,seed={n},{PACE},fault=reset,at=5")
    elif roll < 0.62:  # a reset inside a tool call's arguments
        _chat(client, url, f"chaos:text=8,tools=2,arg_deltas=6,seed={n},fault=reset,at=11,times=1")
    else:
        _chat(client, url, _fault())


def _client_loop(urls: list[str], started: float, stop: threading.Event) -> None:
    with httpx2.Client(timeout=httpx2.Timeout(30.0)) as client:
        while not stop.is_set():
            with contextlib.suppress(httpx2.HTTPError):
                _one_request(client, urls, time.monotonic() - started)


def _websockets(urls: list[str], stop: threading.Event) -> None:
    """Two sockets on replica a for most of the run (a third is refused: the limit is 2),
    one response.create on each every few seconds."""
    ws = urls[0].replace("http://", "ws://") + "/v1/responses"
    with contextlib.ExitStack() as sockets:
        opened = []
        for _ in range(3):
            try:
                opened.append(sockets.enter_context(connect(ws)))
            except (InvalidStatus, WebSocketException, OSError):
                pass  # the third: 426, counted as a refusal
        while not stop.wait(3.0):
            for socket_ in opened:
                n = next(_serial)
                model = f"chaos:text=20,seed={n}"
                create = {"type": "response.create", "model": model, "input": "hi"}
                with contextlib.suppress(WebSocketException, TimeoutError):
                    socket_.send(orjson.dumps(create).decode())
                    while orjson.loads(socket_.recv(10))["type"] not in TERMINAL:
                        pass


def drive(deployment: Deployment, on_tick: Callable[[float], None], tick: float) -> None:
    """Run the traffic for DURATION seconds, calling ``on_tick(seconds)`` every ``tick``."""
    urls = list(deployment.replicas.values())
    stop = threading.Event()
    started = time.monotonic()
    on_tick(0.0)
    threads = [
        threading.Thread(target=_client_loop, args=(urls, started, stop), daemon=True)
        for _ in range(WORKERS)
    ]
    threads.append(threading.Thread(target=_websockets, args=(urls, stop), daemon=True))
    for thread in threads:
        thread.start()
    next_tick = started + tick
    while (now := time.monotonic()) < started + DURATION:
        time.sleep(max(0.0, next_tick - now))
        on_tick(time.monotonic() - started)
        next_tick += tick
    stop.set()  # the last scrape was taken under load, as a live dashboard shows it
    for thread in threads:
        thread.join(30)
