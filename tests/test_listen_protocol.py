"""The request parser fed raw bytes, without sockets (as uvicorn's protocol tests do)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import PlainTextResponse
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.listen import STATE_KEY, GuardedHttpToolsProtocol, ListenLimits

LIMITS = ListenLimits(max_header_bytes=2048, max_headers=16, header_timeout=60, body_timeout=60)


class Transport(asyncio.Transport):
    """What the protocol wrote, and whether it closed or half-closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False
        self.eof = False

    def write(self, data: Any) -> None:
        self.written += data

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def feed(chunks: list[bytes]) -> Transport:
    async def go() -> Transport:
        config = Config(PlainTextResponse("ok"), http=GuardedHttpToolsProtocol, log_level="error")
        protocol = GuardedHttpToolsProtocol(
            config=config, server_state=ServerState(), app_state={STATE_KEY: LIMITS}
        )
        transport = Transport()
        protocol.connection_made(transport)
        for chunk in chunks:
            if transport.is_closing() or transport.eof:
                break
            protocol.data_received(chunk)
            await asyncio.sleep(0)  # let a request that started run
        protocol.connection_lost(None)
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return transport

    return asyncio.run(go())


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=4096), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_random_bytes_never_break_the_parser(data: bytes, cuts: list[int]) -> None:
    """Whatever arrives, however split: no exception escapes, any answer is HTTP."""
    transport = feed(split(data, cuts))
    if transport.written:
        assert transport.written.startswith(b"HTTP/1.1 ")


@settings(max_examples=100, deadline=None)
@given(
    size=st.integers(min_value=LIMITS.max_header_bytes + 1, max_value=64 * 1024),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_a_head_over_the_limit_is_refused_however_it_arrives(size: int, cuts: list[int]) -> None:
    head = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    transport = feed(split(head, cuts))
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert transport.eof or transport.closing


@settings(max_examples=100, deadline=None)
@given(fields=st.integers(min_value=0, max_value=40), cuts=st.lists(st.integers(), max_size=4))
def test_header_fields_are_counted(fields: int, cuts: list[int]) -> None:
    head = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % n for n in range(fields)) + b"\r\n"
    written = bytes(feed(split(head, cuts)).written)
    if fields > LIMITS.max_headers:
        assert written.startswith(b"HTTP/1.1 431 ")
    else:
        assert not written.startswith(b"HTTP/1.1 431 ")
