"""Real servers on loopback for tests: the gateway under uvicorn in a thread, free ports."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gateway.app import create_app
from gateway.config.load import parse_config
from gateway.config.schema import GatewayConfig
from gateway.metrics import Metrics
from gateway.serve import in_thread


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def gateway_config(upstream_url: str, **overrides: Any) -> GatewayConfig:
    """A config with one upstream named ``chaos``, short timeouts, one catch-all route.

    Its continuation is ``prompt`` unless the test says otherwise: the default, ``auto``,
    would first ask the upstream ``GET /models`` (tests/api/test_continuation_modes.py),
    a request the tests that count an upstream's requests would see."""
    upstream = {
        "name": "chaos",
        "base_url": upstream_url,
        "timeouts": {"connect": 2, "first_byte": 5, "idle": 2},
    }
    upstream.update(overrides.pop("upstream", {}))
    if upstream.get("kind", "openai") == "openai":
        upstream.setdefault("continuation", "prompt")
    data: dict[str, Any] = {"upstreams": [upstream], **overrides}
    return parse_config(data, "test config")


FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "idle_retry_delay": 0.01}


def recovering_config(upstream_url: str, **overrides: Any) -> GatewayConfig:
    """``gateway_config`` for recovery tests: the catch-all route retries at once
    (``FAST_RETRY``) and a stall shows in half a second. A ``route`` or ``upstream``
    override is merged into these."""
    route = {"match": "*", "upstream": "chaos", "retry": FAST_RETRY} | overrides.pop("route", {})
    upstream = {"timeouts": {"connect": 2, "first_byte": 3, "idle": 0.5}}
    upstream |= overrides.pop("upstream", {})
    return gateway_config(upstream_url, upstream=upstream, routes=[route], **overrides)


@dataclass
class RunningGateway:
    url: str  # http://127.0.0.1:PORT
    metrics: Metrics

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


@contextlib.contextmanager
def running_gateway(config: GatewayConfig) -> Iterator[RunningGateway]:
    """Serve ``create_app(config)`` with uvicorn (uvloop + httptools) on a free port."""
    metrics = Metrics()
    app = create_app(config, metrics)
    with in_thread(app, ws_max_size=config.websocket.max_message_bytes) as url:
        yield RunningGateway(url, metrics)


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, message: str = "timed out") -> Any:
    """Poll ``predicate`` until it returns something true; return that."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, message
        time.sleep(0.01)
    return value
