"""The one place that speaks HTTP to upstreams: httpx2 requests over each upstream's transport
(``reach.py``: the gateway's own HTTP/1.1 engine, or httpx2's over HTTP/2 or an https:// proxy).

Errors from httpx2 are translated here (``map_open_errors``) into the gateway's own
errors, so handlers never see a transport exception before the stream starts.

Past 450 lines on purpose: ``UpstreamClient`` is every request to an upstream (a
stream opened, read again or cancelled, a passthrough, a model list) and what it
learned of each (a refused prefill or background response, a continuation mode), and
all of them share its pool, credentials, URLs and error mapping; what a provider's door
is (``providers.py``), how it is reached (``reach.py``) and the wire (``transport.py``)
are apart.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx2

from gateway.config.schema import Continuation, Limits, Upstream
from gateway.errors import UpstreamFailure, UpstreamTimeout
from gateway.recovery.classify import Cause, classify_transport_error
from gateway.recovery.plan import Position
from gateway.upstream.breaker import CircuitBreakers, OnChange
from gateway.upstream.continuation import learned_continuation
from gateway.upstream.headers import (
    CREDENTIALS,
    OWN_CREDENTIALS,
    answer_metadata,
    end_to_end_headers,
    forwarded_request_headers,
)
from gateway.upstream.providers import Decoder, provider_for
from gateway.upstream.reach import reach_of, transports_for
from gateway.upstream.routes import ResolvedLeg
from gateway.upstream.target import upstream_url
from gateway.upstream.transport import Http1Transport, Target

# Headers that speak for an identity on a cloud (AWS's, Google's): never a client's.
CLOUD_PREFIXES = ("x-amz-", "x-goog-")
# Continuation modes whose request ends with an assistant message for the model to go on.
PREFILL_MODES = frozenset({"prefill", "vllm", "prefix", "prefix_echo"})
REDACTED = b"[redacted]"
logger = logging.getLogger("gateway.upstream")
MAX_ERROR_BYTES = 1024 * 1024  # an upstream's error body is relayed up to this size
CANCEL_TIMEOUT = 5.0  # the longest a cancel of a background response is waited for


def _secrets_of(upstreams: Iterable[Upstream]) -> tuple[bytes, ...]:
    """Every configured credential, longest first (so none is left half-replaced)."""
    values = set()
    for upstream in upstreams:
        if upstream.api_key is not None:
            values.add(upstream.api_key.get_secret_value())
        values.update(v.get_secret_value() for v in upstream.headers.values())
        for aws in (upstream.aws_secret_access_key, upstream.aws_session_token):
            if aws is not None:
                values.add(aws.get_secret_value())
    # Very short values would redact ordinary text; no real credential is that short.
    return tuple(sorted((v.encode() for v in values if len(v) >= 8), key=len, reverse=True))


class UpstreamHTTPError(Exception):
    """The upstream answered with an error status before any stream: passed on unchanged."""

    def __init__(self, status_code: int, headers: list[tuple[str, str]], content: bytes) -> None:
        super().__init__(f"upstream answered HTTP {status_code}")
        self.status_code = status_code
        self.headers = headers
        self.content = content


@contextmanager
def map_open_errors(leg: ResolvedLeg) -> Iterator[None]:
    """Translate failures while waiting for response headers into 502/504."""
    upstream = leg.upstream
    try:
        yield
    except TimeoutError:
        raise UpstreamTimeout(
            f"Upstream {upstream.name!r} sent no response within {leg.timeouts.first_byte:g}s."
        ) from None
    except httpx2.TransportError as exc:
        cause = classify_transport_error(exc)
        if cause is Cause.IDLE:
            raise UpstreamTimeout(f"Upstream {upstream.name!r} did not answer in time.") from None
        what = "could not be reached" if cause is Cause.CONNECT else "dropped the connection"
        raise UpstreamFailure(f"Upstream {upstream.name!r} {what}.") from None


class UpstreamClient:
    """The app's upstream client (one pool); ``for_client`` gives one request's view of it."""

    def __init__(
        self,
        upstreams: Iterable[Upstream],
        limits: Limits,
        *,
        on_circuit_change: OnChange | None = None,
    ) -> None:
        # Each upstream's circuit breaker, shared by the views (``for_client``).
        self.circuits = CircuitBreakers(upstreams, on_change=on_circuit_change)
        # One per upstream: its proxy, CAs, client certificate and HTTP version.
        self._transports = transports_for(upstreams, limits)
        # Plain-http upstreams behind a proxy: a 407 can only be the proxy's (through a
        # tunnel, its refusal is raised before any response).
        self._forwarded = {
            u.name
            for u in upstreams
            if u.base_url.startswith("http://") and reach_of(u).proxy is not None
        }
        # The static part of each upstream's headers, and its URLs, parsed once.
        self._headers = {u.name: self._static_headers(u) for u in upstreams}
        # Each upstream's door: URL, body, credentials, framing (providers.py).
        self._providers = {u.name: provider_for(u) for u in upstreams}
        self._secrets = _secrets_of(upstreams)
        # (upstream, model) pairs that refused a continuation with a trailing assistant
        # message: from then on they are continued in prompt mode (shared by the views).
        self._no_prefill: set[tuple[str, str]] = set()
        # (upstream, model) of ``auto`` upstreams: the mode learned from the server.
        self._learned: dict[tuple[str, str], Continuation] = {}
        # (upstream, model) pairs that refused a background response (a 4xx naming it):
        # asked in the foreground from then on (``runs_background``).
        self._no_background: set[tuple[str, str]] = set()
        self._roots = {u.name: httpx2.URL(u.api_root) for u in upstreams}
        self._anthropic_versions = {
            u.name: u.anthropic_version for u in upstreams if u.kind == "anthropic"
        }
        # (upstream, path): its URL, and the builtin engine's target for a POST to it.
        self._stream_targets: dict[tuple[str, str], tuple[httpx2.URL, Target | None]] = {}
        self.max_event_bytes = limits.max_event_bytes  # one SSE line or event (sse.py)
        # Set on a view by ``for_client``: what goes upstream from its client, and what
        # comes back to it from the first response that answered (the app's client keeps
        # none: its runs are takeovers, whose client gets no response headers from them).
        self._view = False
        self._client_headers: dict[str, str] = {}
        self.answer_metadata: dict[str, str] | None = None

    def for_client(
        self, headers: Iterable[tuple[str, str]], *, credentials: bool
    ) -> UpstreamClient:
        """This client, for one client's run: the client's forwardable headers go with
        every chat completion it opens, and the first answer's metadata is kept for the
        client's response (``headers.py``). It shares the pool: only the app's client,
        not a view, is closed. ``credentials``: whether the gateway has no keys, so a
        client's own credential headers may go to an upstream without one."""
        view = copy.copy(self)
        view._view = True
        view._client_headers = forwarded_request_headers(headers, credentials=credentials)
        view.answer_metadata = None
        return view

    async def _send(
        self,
        upstream: str,
        method: str,
        url: httpx2.URL,
        headers: Mapping[str, str],
        content: bytes,
        timeouts: httpx2.Timeout,
        first_byte: float,
        target: Target | None = None,
    ) -> httpx2.Response:
        """One request, until its response's headers. ``target``: the builtin engine's
        for ``method`` and ``url``, when the caller kept one (``_stream_target``)."""
        transport = self._transports[upstream]
        async with asyncio.timeout(first_byte):
            if type(transport) is Http1Transport:
                target = target or transport.target(method, url)
                response = await transport.request(target, headers, content, timeouts.as_dict())
            else:
                request = httpx2.Request(
                    method,
                    url,
                    headers=headers,
                    content=content,
                    extensions={"timeout": timeouts.as_dict()},
                )
                response = await transport.handle_async_request(request)
        if response.status_code == 407 and upstream in self._forwarded:
            # The proxy refused a plain-http request (a tunnel's refusal is raised by
            # httpx2): the upstream was never reached, as with any connect error.
            await response.aclose()
            raise httpx2.ProxyError("The proxy refused the request (407).")
        return response

    @staticmethod
    def _static_headers(upstream: Upstream) -> dict[str, str]:
        headers = {k.lower(): v.get_secret_value() for k, v in upstream.headers.items()}
        if upstream.api_key is not None:
            key = upstream.api_key.get_secret_value()
            if upstream.kind == "anthropic":
                headers["x-api-key"] = key
            elif upstream.kind == "azure":
                headers["api-key"] = key
            elif upstream.kind == "gemini":
                headers["x-goog-api-key"] = key
            else:
                headers["authorization"] = f"Bearer {key}"
        return headers

    def request_headers(
        self,
        upstream: Upstream,
        client_headers: Mapping[str, str],
        client_authorization: str | None,
    ) -> dict[str, str]:
        """What goes to ``upstream``: the client's forwardable headers, then the upstream's
        configured ones. The client's credentials only if the upstream has none of its own.
        """
        own = self._headers[upstream.name]
        headers = dict(client_headers)
        if self._providers[upstream.name].own_credentials:
            # A cloud's own credentials sign it: the client's never go there, nor what
            # would speak for the gateway's identity (x-amz-*, x-goog-*: a quota project,
            # a token), nor the version its body carries instead.
            for name in list(headers):
                if (
                    name in CREDENTIALS
                    or name.startswith(CLOUD_PREFIXES)
                    or (
                        name == "anthropic-version"
                        or (name == "anthropic-beta" and upstream.kind == "bedrock")
                    )
                ):
                    del headers[name]
            headers.update(own)  # the operator's configured headers, as for any upstream
            return headers
        if own.keys() & OWN_CREDENTIALS:
            for name in CREDENTIALS & headers.keys():
                del headers[name]
        elif client_authorization is not None:
            headers["authorization"] = client_authorization
        headers.update(own)
        version = self._anthropic_versions.get(upstream.name)
        if version is not None:  # the client's (the anthropic SDK sends one), else ours
            headers.setdefault("anthropic-version", version)
        return headers

    def upstream_body(self, leg: ResolvedLeg, body: dict[str, Any]) -> dict[str, Any]:
        """The protocol's request body as ``leg``'s provider takes it."""
        return self._providers[leg.upstream.name].body(body, self._client_headers)

    def media_type(self, leg: ResolvedLeg) -> str:
        """What ``leg``'s streaming answers are: text/event-stream, or Bedrock's framing."""
        return self._providers[leg.upstream.name].accept

    def decoder(self, leg: ResolvedLeg) -> Decoder:
        """A decoder of ``leg``'s answer body into the protocol's event payloads."""
        return self._providers[leg.upstream.name].decoder(self.max_event_bytes)

    def continuation_of(self, leg: ResolvedLeg) -> Continuation:
        """How ``leg`` continues an answer: its configured mode (``auto``: the one
        learned, ``learn_continuation``), or ``prompt`` once its model refused a
        trailing assistant message (``refuses_prefill``)."""
        mode = leg.continuation
        if mode == "auto":
            mode = self._learned.get((leg.upstream.name, leg.model), "prompt")
        if mode in PREFILL_MODES and (leg.upstream.name, leg.model) in self._no_prefill:
            return "prompt"
        return mode

    async def learn_continuation(self, leg: ResolvedLeg, authorization: str | None) -> None:
        """For an ``auto`` leg, find out once how its server continues an answer."""
        key = (leg.upstream.name, leg.model)
        if leg.continuation != "auto" or key in self._learned:
            return
        mode, why = await self.probe_continuation(leg, authorization)
        self._learned[key] = mode
        logger.info(
            "continuation learned",
            extra={"upstream": leg.upstream.name, "mode": mode, "reason": why},
        )

    async def probe_continuation(
        self, leg: ResolvedLeg, authorization: str | None = None
    ) -> tuple[Continuation, str]:
        """Ask ``leg``'s server what it is (``GET /models``): the continuation it takes,
        and why (``learned_continuation``). Any failure: prompt, which works anywhere."""
        headers = self.request_headers(leg.upstream, {}, authorization)
        headers["accept-encoding"] = "identity"
        try:
            async with asyncio.timeout(leg.timeouts.first_byte):
                response = await self.forward(leg, "GET", "/models", headers, b"")
                try:
                    if response.status_code != 200:
                        return "prompt", f"GET /models answered {response.status_code}"
                    body = b""
                    async for part in response.aiter_raw():
                        body += part
                        if len(body) > MAX_ERROR_BYTES:
                            return "prompt", "model list too large"
                finally:
                    await response.aclose()
        except (TimeoutError, UpstreamFailure, httpx2.HTTPError):
            return "prompt", "GET /models failed"
        return learned_continuation(body, leg.model)

    def runs_background(self, leg: ResolvedLeg) -> bool:
        """Whether ``leg``'s stored Responses requests go as background responses: its
        upstream's ``background`` setting, unless its model refused one."""
        upstream = leg.upstream
        return upstream.runs_background and (upstream.name, leg.model) not in self._no_background

    def refuses_background(self, leg: ResolvedLeg) -> None:
        """Remember that ``leg``'s upstream refuses a background response for its model
        (an organisation under zero data retention, a server that does not know it)."""
        self._no_background.add((leg.upstream.name, leg.model))

    def refuses_prefill(self, leg: ResolvedLeg) -> None:
        """Remember that ``leg``'s model answers a trailing assistant message with a 4xx."""
        self._no_prefill.add((leg.upstream.name, leg.model))

    def scrub(self, data: bytes) -> bytes:
        """``data`` with every configured upstream secret replaced: an upstream that
        echoes its key (in a 401, an error event) must not hand it to a client."""
        for secret in self._secrets:
            if secret in data:
                data = data.replace(secret, REDACTED)
        return data

    async def read_error(
        self, response: httpx2.Response
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """An error answer, read (up to ``MAX_ERROR_BYTES``), closed, and scrubbed."""
        content = bytearray()
        try:
            async for part in response.aiter_bytes():
                content += part
                if len(content) > MAX_ERROR_BYTES:
                    del content[MAX_ERROR_BYTES:]
                    break
        except httpx2.TransportError:
            pass  # the error body broke off: relay what arrived of it
        finally:
            await response.aclose()
        headers = [
            # httpx2 decodes header values as UTF-8 when they are: back to Latin-1, which
            # is all a response header can carry, with "?" for what it cannot.
            (k, self.scrub(v.encode("latin-1", "replace")).decode("latin-1"))
            for k, v in end_to_end_headers(response.headers.multi_items())
        ]
        return response.status_code, headers, self.scrub(bytes(content))

    @staticmethod
    def timeout(leg: ResolvedLeg, idle: float) -> httpx2.Timeout:
        connect = leg.timeouts.connect
        return httpx2.Timeout(connect=connect, read=idle, write=connect, pool=connect)

    async def open_stream(
        self,
        leg: ResolvedLeg,
        body: bytes,
        client_authorization: str | None,
        idle_timeout: float,
        path: str = "/chat/completions",
        trace_headers: Mapping[str, str] | None = None,
        *,
        method: str = "POST",
    ) -> httpx2.Response:
        """POST a streaming request (a chat completion, a response…) and wait for its headers.

        Returns the open response (the caller closes it). An error status raises
        ``UpstreamHTTPError`` with the body read; transport failures raise 502/504.
        ``trace_headers``: the ``traceparent`` (and ``tracestate``) of the gateway's
        span for this request, in place of the client's (gateway/tracing.py).
        ``method``: GET for a stream read again (``reattach``), with no body.
        """
        upstream = leg.upstream
        provider = self._providers[upstream.name]
        headers = self.request_headers(upstream, self._client_headers, client_authorization)
        if trace_headers:  # the gateway's span's context, whole: no client tracestate left
            headers.pop("tracestate", None)
            headers.update(trace_headers)
        if body:
            headers["content-type"] = "application/json"
        headers["accept"] = provider.accept
        # Compression would make proxies and the decoder buffer small SSE frames.
        headers["accept-encoding"] = "identity"
        asked = path
        path = provider.target(path, leg.model)
        url, target = self._stream_target(
            upstream.name, path, memo=not provider.model_in_path, method=method
        )
        try:  # a credential lookup is part of the wait for the first byte
            async with asyncio.timeout(leg.timeouts.first_byte):
                await provider.authorize(url, headers, body)
        except TimeoutError:
            raise UpstreamTimeout(
                f"Upstream {upstream.name!r} could not get its credentials within "
                f"{leg.timeouts.first_byte:g}s."
            ) from None
        with map_open_errors(leg):
            response = await self._send(
                upstream.name,
                method,
                url,
                headers,
                body,
                self.timeout(leg, idle_timeout),
                leg.timeouts.first_byte,
                target,
            )
            if response.status_code >= 400:
                status, headers_out, content = await self.read_error(response)
                content = provider.error(status, headers_out, content, asked)
                raise UpstreamHTTPError(status, headers_out, content)
        if self._view and self.answer_metadata is None:
            self.answer_metadata = answer_metadata(response.headers.multi_items())
        return response

    def _stream_target(
        self, upstream: str, path: str, *, memo: bool = True, method: str = "POST"
    ) -> tuple[httpx2.URL, Target | None]:
        """The URL of an API path on ``upstream``, and the builtin engine's target for a
        POST to it: both worked out once per path (not per query, nor per model in the
        path: clients choose those, so a memo of them would grow without bound)."""
        memo = memo and method == "POST" and "?" not in path
        known = self._stream_targets.get((upstream, path)) if memo else None
        if known is None:
            url = upstream_url(self._roots[upstream], path)
            transport = self._transports[upstream]
            target = transport.target(method, url) if type(transport) is Http1Transport else None
            known = (url, target)
            if memo:
                self._stream_targets[upstream, path] = known
        return known

    async def reattach(
        self,
        leg: ResolvedLeg,
        position: Position,
        client_authorization: str | None,
        idle_timeout: float,
        trace_headers: Mapping[str, str] | None = None,
    ) -> httpx2.Response:
        """Stream ``leg``'s background response again, from the event after
        ``position.after`` (``GET /responses/{id}?stream=true&starting_after=N``; -1: from
        its first); as ``open_stream`` otherwise."""
        path = f"/responses/{quote(position.response, safe='')}?stream=true"
        if position.after >= 0:  # else from its first event
            path += f"&starting_after={position.after}"
        return await self.open_stream(
            leg, b"", client_authorization, idle_timeout, path, trace_headers, method="GET"
        )

    async def cancel_response(
        self, leg: ResolvedLeg, response_id: str, client_authorization: str | None
    ) -> int | None:
        """Cancel ``leg``'s background response ``response_id`` (``POST
        /responses/{id}/cancel``), within ``CANCEL_TIMEOUT`` (or the leg's first-byte
        timeout, if shorter): its status, or None if it could not be asked."""
        upstream = leg.upstream
        provider = self._providers[upstream.name]
        headers = self.request_headers(upstream, self._client_headers, client_authorization)
        headers["accept-encoding"] = "identity"
        path = provider.target(f"/responses/{quote(response_id, safe='')}/cancel", leg.model)
        url = upstream_url(self._roots[upstream.name], path)
        try:
            async with asyncio.timeout(min(leg.timeouts.first_byte, CANCEL_TIMEOUT)):
                await provider.authorize(url, headers, b"")
                response = await self._send(
                    upstream.name,
                    "POST",
                    url,
                    headers,
                    b"",
                    self.timeout(leg, leg.timeouts.idle),
                    leg.timeouts.first_byte,
                )
                try:
                    async for _ in response.aiter_raw():
                        pass
                finally:
                    await response.aclose()
        except (TimeoutError, httpx2.HTTPError, OSError):
            return None
        return response.status_code

    async def forward(
        self,
        leg: ResolvedLeg,
        method: str,
        target: str,
        headers: Mapping[str, str],
        content: bytes,
    ) -> httpx2.Response:
        """Send any other request through unchanged; the response is returned open.

        ``target`` is a path and query checked by ``relay_target`` (or a constant): it
        goes under the upstream's base URL and can never change its authority.
        """
        url = upstream_url(self._roots[leg.upstream.name], target)
        with map_open_errors(leg):
            return await self._send(
                leg.upstream.name,
                method,
                url,
                headers,
                content,
                self.timeout(leg, leg.timeouts.idle),
                leg.timeouts.first_byte,
            )

    async def aclose(self) -> None:
        for transport in {id(t): t for t in self._transports.values()}.values():
            await transport.aclose()
