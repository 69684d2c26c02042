"""Ways to run the chaos upstream (or any asyncio server with start and aclose): in a
thread, for sync tests, or as the process's server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from ssl import SSLContext
from typing import Protocol, TypeVar

from gateway.chaos.background import TTL
from gateway.chaos.server import ChaosUpstream

_START_TIMEOUT = 10.0


class AsyncServer(Protocol):
    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


S = TypeVar("S", bound=AsyncServer)


@contextlib.contextmanager
def serving_in_thread(server: S, name: str) -> Iterator[S]:
    """``server.start()`` on a new loop in a daemon thread; ``server.aclose()`` on exit.

    A failure to start is raised again in the caller's thread.
    """
    started = threading.Event()
    failure: list[BaseException] = []
    control: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def main() -> None:
        stop = asyncio.Event()
        try:
            await server.start()
        except Exception as exc:
            failure.append(exc)
            return
        finally:
            control.append((asyncio.get_running_loop(), stop))
            started.set()
        try:
            await stop.wait()
        finally:
            await server.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(main()), name=name, daemon=True)
    thread.start()
    if not started.wait(_START_TIMEOUT):
        raise RuntimeError(f"{name} did not start")
    if failure:
        thread.join(_START_TIMEOUT)
        raise failure[0]
    loop, stop = control[0]
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(_START_TIMEOUT)


@contextlib.contextmanager
def running_chaos_upstream(
    host: str = "127.0.0.1",
    port: int = 0,
    ssl: SSLContext | None = None,
    background_ttl: float = TTL,
) -> Iterator[ChaosUpstream]:
    """Run a ChaosUpstream on its own event loop in a daemon thread; stop it on exit.

    With ``ssl`` (a server context) it listens with TLS; its ``base_url`` is ``https://``.
    ``background_ttl``: how long a background response is kept after it ended.
    """
    upstream = ChaosUpstream(host, port, ssl, background_ttl)
    with serving_in_thread(upstream, "chaos-upstream") as upstream:
        yield upstream


async def serve(host: str, port: int) -> None:
    """Serve until cancelled; say where once bound (``resumable-gateway chaos-upstream``)."""
    upstream = ChaosUpstream(host, port)
    await upstream.start()
    print(f"chaos upstream listening on {upstream.base_url}", flush=True)
    try:
        await upstream.serve_forever()
    finally:
        await upstream.aclose()


def run(host: str = "127.0.0.1", port: int = 8001) -> None:
    """Block serving ``serve(host, port)``, on uvloop when it is installed, until Ctrl-C."""
    try:
        import uvloop
    except ImportError:
        runner = asyncio.Runner()
    else:
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    with contextlib.suppress(KeyboardInterrupt), runner:
        runner.run(serve(host, port))
