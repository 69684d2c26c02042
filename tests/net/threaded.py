"""Run an asyncio server on its own event loop in a daemon thread, for sync tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol, TypeVar

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
