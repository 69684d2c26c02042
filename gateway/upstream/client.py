"""The one place that speaks HTTP to upstreams: httpx requests over one ``Http1Transport``.

Errors from httpx are translated here (``map_open_errors``) into the gateway's own
errors, so handlers never see a transport exception before the stream starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import httpx

from gateway.config import Limits, Upstream
from gateway.errors import UpstreamFailure, UpstreamTimeout
from gateway.recovery.classify import Cause, classify_transport_error
from gateway.upstream.routes import ResolvedLeg
from gateway.upstream.transport import Http1Transport

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


class UpstreamClient:
    def __init__(self, upstreams: Iterable[Upstream], limits: Limits) -> None:
        self._transport = Http1Transport(
            tls=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
        )
        # The static part of each upstream's headers, and its chat URL, built once.
        self._headers = {u.name: self._static_headers(u) for u in upstreams}
        self._chat_urls = {u.name: httpx.URL(u.root + "/chat/completions") for u in upstreams}

    async def _send(
        self,
        method: str,
        url: httpx.URL | str,
        headers: Mapping[str, str],
        content: bytes,
        timeouts: httpx.Timeout,
        first_byte: float,
    ) -> httpx.Response:
        request = httpx.Request(
            method,
            url,
            headers=headers,
            content=content,
            extensions={"timeout": timeouts.as_dict()},
        )
        async with asyncio.timeout(first_byte):
            return await self._transport.handle_async_request(request)

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
        with map_open_errors(upstream):
            response = await self._send(
                "POST",
                self._chat_urls[upstream.name],
                headers,
                body,
                self.timeout(upstream, idle_timeout),
                upstream.timeouts.first_byte,
            )
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
        with map_open_errors(upstream):
            return await self._send(
                method,
                upstream.root + path_and_query,
                headers,
                content,
                self.timeout(upstream, upstream.timeouts.idle),
                upstream.timeouts.first_byte,
            )

    async def aclose(self) -> None:
        await self._transport.aclose()
