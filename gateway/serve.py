"""Running the gateway under uvicorn: workers, logging, metrics directory, drain."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from gateway.app import CONFIG_ENV
from gateway.config.schema import GatewayConfig
from gateway.listen import GuardedHttpToolsProtocol
from gateway.logs import Format
from gateway.logs import config as logging_config
from gateway.metrics import MULTIPROC_ENV
from gateway.supervisor import SUPERVISOR_ENV

# After the drain timeout the gateway ends its streams itself; this is uvicorn's
# backstop for what the drain does not cover (a non-streaming request, a last write).
SHUTDOWN_MARGIN = 5.0


def serve(
    config: GatewayConfig,
    *,
    config_path: str | None,
    host: str | None,
    port: int | None,
    workers: int,
    log_level: str | None,
    log_format: Format | None,
) -> None:
    # Workers re-create the app from the environment (uvicorn needs an import string).
    if config_path:
        os.environ[CONFIG_ENV] = os.path.abspath(config_path)
    else:
        os.environ.pop(CONFIG_ENV, None)
    if workers > 1 or os.environ.get(MULTIPROC_ENV):
        prepare_multiprocess_dir()
    if workers > 1:  # its workers die with it (exit_with_supervisor)
        os.environ[SUPERVISOR_ENV] = str(os.getpid())
    else:
        os.environ.pop(SUPERVISOR_ENV, None)
    level = log_level or config.logging.level
    uvicorn.run(
        "gateway.app:create_app_from_env",
        factory=True,
        host=host or config.listen.host,
        port=config.listen.port if port is None else port,
        workers=workers,
        loop="uvloop",
        http="gateway.listen:GuardedHttpToolsProtocol",
        log_config=logging_config(level, log_format or config.logging.format),
        log_level=level,
        access_log=False,  # gateway.access logs one line per request instead
        # Idle time between requests on a client connection (streams are not idle).
        timeout_keep_alive=30,
        # A Responses API WebSocket's message (api/responses_ws.py); larger closes it (1009).
        ws_max_size=config.websocket.max_message_bytes,
        timeout_graceful_shutdown=math.ceil(config.listen.drain_timeout + SHUTDOWN_MARGIN),
    )


def prepare_multiprocess_dir() -> Path:
    """An empty directory for the workers' metric files, exported to them.

    Wiped at start: files left by an earlier run would be summed into this one's
    counters. Only prometheus-client's own ``*.db`` files are removed, in case the
    variable names a directory that holds anything else. Default: a fresh
    temporary directory.
    """
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        directory = Path(given)
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
    else:
        directory = Path(tempfile.mkdtemp(prefix="resumable-gateway-metrics-"))
    os.environ[MULTIPROC_ENV] = str(directory)
    return directory


@contextlib.contextmanager
def in_thread(
    app: ASGIApp, *, start_timeout: float = 10.0, ws_max_size: int = 16 * 1024 * 1024
) -> Iterator[str]:
    """Serve ``app`` (uvloop + httptools) in a daemon thread on a free loopback port.

    Yields ``http://127.0.0.1:PORT``. For the demo and the tests: no signals, no workers.
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            loop="uvloop",
            http=GuardedHttpToolsProtocol,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ws_max_size=ws_max_size,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(start_timeout)
        sock.close()
