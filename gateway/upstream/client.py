"""The one place that speaks HTTP to upstreams: one pooled httpx client per app.

Errors from httpx are translated here (``map_open_errors``) into the gateway's own
errors, so handlers never see a transport exception before the stream starts.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import contextmanager

import httpx

from gateway.config import Limits, Upstream
from gateway.errors import UpstreamFailure, UpstreamTimeout
from gateway.recovery.classify import Cause, classify_transport_error
from gateway.upstream.routes import ResolvedLeg

# RFC 9110 section 7.6.1 plus the headers httpx sets from the body it sends.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


class UpstreamHTTPError(Exception):
    """The upstream answered with an error status before any stream: passed on unchanged."""

    def __init__(self, status_code: int, headers: list[tuple[str, str]], content: bytes) -> None:
        super().__init__(f"upstream answered HTTP {status_code}")
        self.status_code = status_code
        self.headers = headers
        self.content = content


def end_to_end_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


@contextmanager
def map_open_errors(upstream: Upstream) -> Iterator[None]:
    """Translate failures while waiting for response headers into 502/504."""
    try:
        yield
    except TimeoutError:
        raise UpstreamTimeout(
            f"Upstream {upstream.name!r} sent no response within {upstream.timeouts.first_byte:g}s."
        ) from None
    except httpx.TransportError as exc:
        cause = classify_transport_error(exc)
        if cause is Cause.IDLE:
            raise UpstreamTimeout(f"Upstream {upstream.name!r} did not answer in time.") from None
        what = "could not be reached" if cause is Cause.CONNECT else "dropped the connection"
        raise UpstreamFailure(f"Upstream {upstream.name!r} {what}.") from None


POOLS = 128  # at most; a pool is added only when the ones before it are busy
POOL_STREAMS = 4  # open responses a pool takes before the next pool is used


class _Pool:
    """One httpx client, and how many of its responses are open."""

    def __init__(self, limits: httpx.Limits, tls: ssl.SSLContext) -> None:
        self.http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(
                verify=tls,
                limits=limits,
                # A request's head and body are separate writes: without this,
                # Nagle's algorithm may hold the body until the head is ACKed.
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            ),
            timeout=None,
        )
        self.open = 0

    async def send(self, request: httpx.Request) -> httpx.Response:
        self.open += 1  # at once: a burst of requests must see each other
        try:
            response = await self.http.send(request, stream=True)
        except BaseException:
            self.open -= 1
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Counted(response.stream, self)
        return response


class _Counted(httpx.AsyncByteStream):
    """A response body that tells its pool when it is closed."""

    def __init__(self, body: httpx.AsyncByteStream, pool: _Pool) -> None:
        self._body = body
        self._pool: _Pool | None = pool

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._body.__aiter__()

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.open -= 1
            self._pool = None
        await self._body.aclose()


class UpstreamClient:
    def __init__(self, upstreams: Iterable[Upstream], limits: Limits) -> None:
        # httpcore's pool scans every connection it holds (with a poll() of each
        # idle one) on each request and each release: O(N^2) over N concurrent
        # streams (encode/httpcore#1035). With keep-alive at 256 streams the scans
        # stretched request starts to over a second (bench/, BENCHMARKS.md). So
        # requests go to the first of several small pools with room: a quiet
        # gateway uses one pool (and reuses its connections); a busy one spreads.
        shards = min(POOLS, limits.max_connections)
        self._limits = httpx.Limits(
            max_connections=-(-limits.max_connections // shards),
            max_keepalive_connections=min(
                limits.max_keepalive_connections,
                max(POOL_STREAMS, -(-limits.max_keepalive_connections // shards)),
            ),
        )
        self._shards = shards
        self._pools: list[_Pool] = []
        # One TLS context for all pools: each loads the CA bundle, milliseconds apiece.
        self._tls = httpx.create_ssl_context()
        # The static part of each upstream's headers, built once.
        self._headers = {u.name: self._static_headers(u) for u in upstreams}

    def _pool(self) -> _Pool:
        for pool in self._pools:
            if pool.open < POOL_STREAMS:
                return pool
        if len(self._pools) < self._shards:
            self._pools.append(_Pool(self._limits, self._tls))
            return self._pools[-1]
        return min(self._pools, key=lambda pool: pool.open)

    @staticmethod
    def _static_headers(upstream: Upstream) -> dict[str, str]:
        headers = {k.lower(): v.get_secret_value() for k, v in upstream.headers.items()}
        if upstream.api_key is not None:
            headers["authorization"] = f"Bearer {upstream.api_key.get_secret_value()}"
        return headers

    def auth_headers(self, upstream: Upstream, client_authorization: str | None) -> dict[str, str]:
        """Configured headers; the client's Authorization only if the upstream has no key."""
        headers = dict(self._headers[upstream.name])
        if client_authorization is not None and "authorization" not in headers:
            headers["authorization"] = client_authorization
        return headers

    @staticmethod
    def timeout(upstream: Upstream, idle: float) -> httpx.Timeout:
        t = upstream.timeouts
        return httpx.Timeout(connect=t.connect, read=idle, write=t.connect, pool=t.connect)

    async def open_stream(
        self,
        leg: ResolvedLeg,
        body: bytes,
        client_authorization: str | None,
        idle_timeout: float,
    ) -> httpx.Response:
        """POST a streaming chat completion and wait for its headers.

        Returns the open response (the caller closes it). An error status raises
        ``UpstreamHTTPError`` with the body read; transport failures raise 502/504.
        """
        upstream = leg.upstream
        headers = self.auth_headers(upstream, client_authorization)
        headers["content-type"] = "application/json"
        headers["accept"] = "text/event-stream"
        # Compression would make proxies and the decoder buffer small SSE frames.
        headers["accept-encoding"] = "identity"
        pool = self._pool()
        request = pool.http.build_request(
            "POST",
            upstream.root + "/chat/completions",
            content=body,
            headers=headers,
            timeout=self.timeout(upstream, idle_timeout),
        )
        with map_open_errors(upstream):
            async with asyncio.timeout(upstream.timeouts.first_byte):
                response = await pool.send(request)
            if response.status_code >= 400:
                try:
                    content = await response.aread()
                finally:
                    await response.aclose()
                raise UpstreamHTTPError(
                    response.status_code,
                    end_to_end_headers(response.headers.multi_items()),
                    content,
                )
        return response

    async def forward(
        self,
        upstream: Upstream,
        method: str,
        path_and_query: str,
        headers: Mapping[str, str],
        content: bytes,
    ) -> httpx.Response:
        """Send any other request through unchanged; the response is returned open."""
        pool = self._pool()
        request = pool.http.build_request(
            method,
            upstream.root + path_and_query,
            content=content,
            headers=headers,
            timeout=self.timeout(upstream, upstream.timeouts.idle),
        )
        with map_open_errors(upstream):
            async with asyncio.timeout(upstream.timeouts.first_byte):
                return await pool.send(request)

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.http.aclose()
