"""``Http1Transport`` against real loopback servers that answer with scripted bytes."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx2
import pytest

from gateway.upstream.connection import whole
from gateway.upstream.transport import Http1Transport

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"


class Server:
    """Answers each request on a connection with ``script``; counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.accepted = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.lower().split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                if not await self.script(reader, writer):
                    break
        except asyncio.IncompleteReadError:
            pass  # the client closed the connection
        finally:
            writer.close()


def transport(**kwargs: Any) -> Http1Transport:
    options: dict[str, Any] = {"max_connections": 16, "max_keepalive_connections": 16}
    return Http1Transport(tls=httpx2.create_ssl_context(), **(options | kwargs))


async def request(
    pool: Http1Transport, port: int, *, read: float = 5.0, pool_timeout: float = 5.0, **kw: Any
) -> httpx2.Response:
    timeouts = {"connect": 5.0, "read": read, "write": 5.0, "pool": pool_timeout}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    sent = httpx2.Request("POST", url, content=b'{"a": 1}', extensions={"timeout": timeouts}, **kw)
    return await pool.handle_async_request(sent)


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(scenario)


async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(CHUNKED + b"5\r\nhello\r\n0\r\n\r\n")
    return True


def test_connections_are_reused_one_request_at_a_time() -> None:
    async def scenario() -> None:
        async with Server(hello) as server:
            pool = transport()
            for _ in range(3):
                response = await request(pool, server.port)
                assert await response.aread() == b"hello"
                await response.aclose()
            assert server.accepted == 1
            responses = await asyncio.gather(*(request(pool, server.port) for _ in range(3)))
            assert server.accepted == 3  # one idle connection reused, two new ones
            for response in responses:
                await response.aread()
                await response.aclose()
            assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert f"\r\nhost: 127.0.0.1:{server.port}\r\n".encode() in server.requests[0].lower()
            assert server.requests[0].endswith(b'\r\n\r\n{"a": 1}')
            await pool.aclose()

    run(scenario())


def test_a_response_closed_before_its_end_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def partial(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + b"5\r\nhello\r\n")
        if await reader.read(1) == b"":  # waits for the client to close
            closed.set()
        return False

    async def scenario() -> None:
        async with Server(partial) as server:
            pool = transport()
            response = await request(pool, server.port)
            assert [chunk async for chunk in _first(response)] == [b"hello"]
            await response.aclose()
            async with asyncio.timeout(5):
                await closed.wait()
            response = await request(pool, server.port)
            await response.aclose()
            assert server.accepted == 2
            await pool.aclose()

    run(scenario())


async def _first(response: httpx2.Response) -> Any:
    async for chunk in response.aiter_raw():
        yield chunk
        return


def test_a_body_without_length_ends_with_the_connection() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"part two")
        return False

    async def scenario() -> None:
        async with Server(until_close) as server:
            pool = transport()
            response = await request(pool, server.port)
            assert await response.aread() == b"part one, part two"
            await response.aclose()
            await pool.aclose()

    run(scenario())


def test_a_truncated_chunked_body_is_a_protocol_error() -> None:
    async def truncated(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + b"5\r\nhello\r\n")
        return False

    async def scenario() -> None:
        async with Server(truncated) as server:
            pool = transport()
            response = await request(pool, server.port)
            with pytest.raises(httpx2.RemoteProtocolError, match="complete message body"):
                await response.aread()
            await response.aclose()
            await pool.aclose()

    run(scenario())


def test_a_reset_mid_body_is_a_read_error() -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + b"5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False

    async def scenario() -> None:
        async with Server(reset) as server:
            pool = transport()
            response = await request(pool, server.port)
            with pytest.raises(httpx2.ReadError):
                await response.aread()
            await response.aclose()
            await pool.aclose()

    run(scenario())


def test_silence_is_a_read_timeout_but_a_slow_drip_is_not() -> None:
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED)
        for _ in range(8):  # 0.8 s in all, far beyond the 0.3 s read timeout
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nx\r\n")
        writer.write(b"0\r\n\r\n")
        return True

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + b"1\r\nx\r\n")
        await asyncio.sleep(2)
        return False

    async def scenario() -> None:
        pool = transport()
        async with Server(drip) as server:
            response = await request(pool, server.port, read=0.3)
            assert await response.aread() == b"x" * 8
            await response.aclose()
        async with Server(silent) as server:
            response = await request(pool, server.port, read=0.3)
            started = time.perf_counter()
            with pytest.raises(httpx2.ReadTimeout):
                await response.aread()
            assert 0.25 < time.perf_counter() - started < 1.0
            await response.aclose()
        await pool.aclose()

    run(scenario())


def test_a_full_pool_times_out_and_frees_its_slot_on_close() -> None:
    async def scenario() -> None:
        async with Server(hello) as server:
            pool = transport(max_connections=1)
            first = await request(pool, server.port)
            with pytest.raises(httpx2.PoolTimeout):
                await request(pool, server.port, pool_timeout=0.1)
            await first.aclose()  # unread: its connection is closed, its slot freed
            second = await request(pool, server.port, pool_timeout=0.1)
            assert await second.aread() == b"hello"
            await second.aclose()
            await pool.aclose()

    run(scenario())


def test_a_header_value_cannot_end_its_line() -> None:
    async def scenario() -> None:
        async with Server(hello) as server:
            pool = transport()
            with pytest.raises(httpx2.LocalProtocolError):
                await request(pool, server.port, headers={"x-a": "1\r\nx-injected: 1"})
            assert server.accepted == 0
            await pool.aclose()

    run(scenario())


TIMEOUTS: dict[str, float | None] = {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}


def test_a_request_from_a_target_writes_the_head_an_httpx_request_would() -> None:
    # The gateway's own path (no httpx2.Request): request line and Host from the target,
    # then the headers as given, then Content-Length and the body.
    async def scenario() -> None:
        async with Server(hello) as server:
            pool = transport()
            url = httpx2.URL(f"http://127.0.0.1:{server.port}/v1/chat/completions?x=1")
            target = pool.target("POST", url)
            for headers in (
                {"authorization": "Bearer k", "x-é": "café"},
                {"host": "vhost.example"},
            ):
                response = await pool.request(target, headers, b'{"a": 1}', TIMEOUTS)
                assert await response.aread() == b"hello"
                await response.aclose()
            assert server.accepted == 1
            plain, virtual = server.requests
            assert plain == (
                b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n"
                + f"Host: 127.0.0.1:{server.port}\r\n".encode()
                + b"authorization: Bearer k\r\nx-\xe9: caf\xe9\r\n"
                + b'Content-Length: 8\r\n\r\n{"a": 1}'
            )
            # A configured Host (a virtual host) replaces the URL's: one Host line.
            assert virtual.lower().count(b"\r\nhost:") == 1
            assert b"\r\nhost: vhost.example\r\n" in virtual
            await pool.aclose()

    run(scenario())


@pytest.mark.parametrize("value", ["1\r\nx-injected: 1", "1\nx-injected: 1", "1\r", "1\0"])
def test_a_header_value_from_a_target_request_cannot_end_its_line(value: str) -> None:
    async def scenario() -> None:
        async with Server(hello) as server:
            pool = transport()
            target = pool.target("POST", httpx2.URL(f"http://127.0.0.1:{server.port}/v1/x"))
            with pytest.raises(httpx2.LocalProtocolError):
                await pool.request(target, {"x-a": value}, b"{}", TIMEOUTS)
            assert server.accepted == 0
            await pool.aclose()

    run(scenario())


def test_a_whole_body_is_let_go_unread_and_its_connection_reused() -> None:
    async def partly_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        return True

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + b"5\r\nhello\r\n")  # the rest never comes
        return True

    async def scenario() -> None:
        async with Server(partly_read) as server:
            pool = transport()
            for _ in range(2):
                response = await request(pool, server.port)
                await asyncio.sleep(0.05)  # all of it arrived, none of it read
                assert whole(response)
                await response.aclose()
            assert server.accepted == 1  # reusable: what was left unread was let go
            await pool.aclose()
        async with Server(slow) as server:
            pool = transport()
            response = await request(pool, server.port)
            await asyncio.sleep(0.05)
            assert not whole(response)  # still arriving: it has to be read (or waited for)
            await response.aclose()
            await pool.aclose()

    run(scenario())


def test_an_idle_connection_the_server_closed_or_that_expired_is_not_reused() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await hello(reader, writer)
        return False  # keep-alive by the headers, yet closed right after

    async def scenario() -> None:
        async with Server(once) as server:
            pool = transport()
            for _ in range(2):
                response = await request(pool, server.port)
                assert await response.aread() == b"hello"
                await response.aclose()
                await asyncio.sleep(0.05)  # the server's FIN arrives
            assert server.accepted == 2
            await pool.aclose()
        async with Server(hello) as server:
            pool = transport(keepalive_expiry=0.1)
            for _ in range(2):
                response = await request(pool, server.port)
                await response.aread()
                await response.aclose()
                await asyncio.sleep(0.2)
            assert server.accepted == 2
            await pool.aclose()

    run(scenario())


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused

        async def scenario() -> None:
            pool = transport()
            with pytest.raises(httpx2.ConnectError):
                await request(pool, port)
            await pool.aclose()

        run(scenario())
