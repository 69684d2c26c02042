"""How each upstream is reached: directly or through a proxy, which CAs, which HTTP engine.

Decided once, at start-up, from the config and the environment (policy; no I/O but
reading certificate files):

- **proxy**: an upstream's own ``proxy`` (a URL, or ``null`` for direct), else the
  environment as curl and httpx2 read it: ``https_proxy`` / ``http_proxy`` by the
  upstream's scheme, then ``all_proxy`` (lower case first, then upper case), unless
  ``no_proxy`` names the host (``*``, a host, a domain and its subdomains with or
  without a leading dot, an IP address or a CIDR range; an optional ``:port``).
  HTTPS through an HTTP proxy is a ``CONNECT`` tunnel; credentials in the proxy URL
  go as ``Proxy-Authorization``, and are masked wherever the URL is shown.
- **TLS**: ``tls.ca_file``, else ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, else the
  operating system's trust store (OpenSSL's default CA file and directory, as httpx2
  reads it; no certifi bundle); ``tls.client_cert`` / ``client_key`` for mutual TLS;
  ``verify: false`` checks nothing (warned). The context is built here, for every
  engine alike, from the environment read once at start-up.
- **engine**: the gateway's own HTTP/1.1 transport (``transport.py``), directly or
  through an ``http://`` proxy, by far the cheapest per event (BENCHMARKS.md,
  "Upstream HTTP engines"); httpx2's own (httpcore2) over HTTP/2 or through an
  ``https://`` proxy; ``engine:`` forces one.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore2
import httpx2
from pydantic import SecretStr

from gateway.config.schema import PROXY_SCHEMES, ConfigError, Limits, Tls, Upstream, mask_url
from gateway.upstream.transport import KEEPALIVE_EXPIRY, Http1Transport

logger = logging.getLogger("gateway.upstream")

SYSTEM_STORE = "the system store"  # where the trusted CAs come from, by default


@dataclass(frozen=True, slots=True)
class Reach:
    """How one upstream is reached."""

    proxy: SecretStr | None  # the proxy URL (credentials and all), None: direct
    proxy_source: str  # "config", "HTTPS_PROXY"…, or why it is direct
    http2: bool
    engine: str  # builtin or httpx
    ca: str  # where the trusted CAs come from

    def describe(self) -> str:
        """One line for ``check-config``, credentials masked."""
        if self.proxy is None:
            via = f"direct ({self.proxy_source})" if self.proxy_source else "direct"
        else:
            via = f"via proxy {mask_url(self.proxy)} ({self.proxy_source})"
        http = "HTTP/2" if self.http2 else "HTTP/1.1"
        return f"{via}, {http} ({self.engine} engine), CAs: {self.ca}"


def reach_of(upstream: Upstream, env: Mapping[str, str] | None = None) -> Reach:
    """How ``upstream`` is reached; ``ConfigError`` if that cannot work (a proxy from the
    environment that is not http:// or https://, or that the forced engine cannot use)."""
    env = os.environ if env is None else env
    proxy, source = _proxy(upstream, env)
    tls_proxy = proxy is not None and proxy.get_secret_value().startswith("https://")
    # HTTP/2 is negotiated by TLS (ALPN), as httpx2 does it: an http:// upstream speaks 1.1.
    http2 = upstream.http2 and upstream.base_url.startswith("https://")
    engine = upstream.engine
    if engine == "auto":
        # The builtin engine speaks HTTP/1.1, directly or through an http:// proxy.
        engine = "httpx" if http2 or tls_proxy else "builtin"
    elif engine == "builtin" and tls_proxy:
        raise ConfigError(
            f"upstreams.{upstream.name}: engine builtin cannot use the https:// proxy from "
            f"{source}; use engine auto or httpx"
        )
    return Reach(proxy, source, http2, engine, _ca_source(upstream, env))


def _proxy(upstream: Upstream, env: Mapping[str, str]) -> tuple[SecretStr | None, str]:
    if "proxy" in upstream.model_fields_set:
        if upstream.proxy is None:
            return None, "proxy: null"
        return upstream.proxy, "config"
    url = urlsplit(upstream.base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    for name in (f"{url.scheme}_proxy", "all_proxy"):
        for key in (name, name.upper()):
            value = env.get(key, "").strip()
            if value:
                if bypassed(url.hostname or "", port, _no_proxy(env)):
                    return None, "NO_PROXY"
                if "://" not in value:
                    value = "http://" + value  # curl's default scheme for a proxy
                if not value.startswith(PROXY_SCHEMES):
                    scheme = value.partition("://")[0]
                    raise ConfigError(
                        f"upstreams.{upstream.name}: the proxy in {key} is a {scheme}:// proxy; "
                        "only http:// and https:// proxies are supported (set the "
                        "upstream's proxy, or null to go direct)"
                    )
                return SecretStr(value), key
    return None, ""


def _no_proxy(env: Mapping[str, str]) -> str:
    return env.get("no_proxy") or env.get("NO_PROXY", "")


def bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``no_proxy`` (comma- or space-separated) says to reach ``host`` directly."""
    host = host.lower().strip("[]")
    for entry in no_proxy.replace(" ", ",").split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if _has_port(entry) else (entry, "", "")
        if entry_port and port is not None and entry_port != str(port):
            continue
        name = name.strip("[]")
        if _ip_match(host, name):
            return True
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


def _has_port(entry: str) -> bool:
    if entry.startswith("["):
        return "]:" in entry
    return entry.count(":") == 1  # an IPv6 address has more than one


def _ip_match(host: str, entry: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
        network = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return address in network


def _ca_source(upstream: Upstream, env: Mapping[str, str]) -> str:
    tls = upstream.tls
    if not tls.verify:
        return "none (verify: false)"
    if tls.ca_file:
        return tls.ca_file
    for key in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        if env.get(key):
            return f"{key}={env[key]}"
    return SYSTEM_STORE


def check_reach(upstreams: Iterable[Upstream], env: Mapping[str, str] | None = None) -> None:
    """Everything ``transports_for`` will need, loaded once: ``ConfigError`` naming the
    upstream if a proxy cannot be used or a certificate file cannot be read (start-up
    and ``check-config`` stop there, with that message rather than a traceback)."""
    for upstream in upstreams:
        reach_of(upstream, env)
        tls_context(upstream, env, warn=False)


def tls_context(
    upstream: Upstream, env: Mapping[str, str] | None = None, *, warn: bool = True
) -> ssl.SSLContext:
    """The TLS context of ``upstream``'s connections; ``ConfigError`` if a configured
    certificate file cannot be loaded."""
    try:
        return _tls_context(upstream, os.environ if env is None else env, warn=warn)
    except (OSError, ssl.SSLError) as exc:  # ssl.SSLError is an OSError; said for clarity
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ConfigError(
            f"upstreams.{upstream.name}.tls: a certificate or key file cannot be loaded ({reason})"
        ) from None


def _tls_context(upstream: Upstream, env: Mapping[str, str], *, warn: bool) -> ssl.SSLContext:
    tls = upstream.tls
    if not tls.verify:
        if warn:
            logger.warning(
                "TLS certificates of upstream %r are not verified (tls.verify: false)",
                upstream.name,
            )
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif tls.ca_file:
        context = ssl.create_default_context(cafile=tls.ca_file)
    elif env.get("SSL_CERT_FILE") or env.get("SSL_CERT_DIR"):
        context = ssl.create_default_context(
            cafile=env.get("SSL_CERT_FILE") or None, capath=env.get("SSL_CERT_DIR") or None
        )
    else:
        context = _system_context(shared=False)
    if tls.client_cert is not None:
        context.load_cert_chain(tls.client_cert, tls.client_key)
    return context


def transports_for(
    upstreams: Iterable[Upstream], limits: Limits, env: Mapping[str, str] | None = None
) -> dict[str, httpx2.AsyncBaseTransport]:
    """Each upstream's transport: one per way of reaching (engine, proxy, HTTP version,
    TLS settings), so upstreams on one provider share its pool and ``limits`` hold
    for them together, as for all the direct ones on the usual defaults."""
    shared: dict[tuple[object, ...], httpx2.AsyncBaseTransport] = {}
    transports = {}
    for upstream in upstreams:
        reach = reach_of(upstream, env)
        proxy = None if reach.proxy is None else reach.proxy.get_secret_value()
        key = (reach.engine, proxy, reach.http2, upstream.tls)
        if key not in shared:
            shared[key] = transport_for(upstream, limits, env)
        transports[upstream.name] = shared[key]
    return transports


def transport_for(
    upstream: Upstream, limits: Limits, env: Mapping[str, str] | None = None
) -> httpx2.AsyncBaseTransport:
    """The transport ``upstream``'s requests go through, as ``reach_of`` decides."""
    reach = reach_of(upstream, env)
    if reach.engine == "builtin" and reach.ca == SYSTEM_STORE and upstream.tls == Tls():
        context = _system_context()  # the usual case: one context for all (read-only here)
    else:
        context = tls_context(upstream, env)
    if reach.engine == "builtin":
        return Http1Transport(
            tls=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            proxy=None if reach.proxy is None else httpx2.URL(reach.proxy.get_secret_value()),
        )
    pool = httpx2.Limits(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=KEEPALIVE_EXPIRY,
    )
    proxy = None if reach.proxy is None else reach.proxy.get_secret_value()
    return HttpcoreErrors(
        httpx2.AsyncHTTPTransport(
            verify=context,
            http2=reach.http2,
            limits=pool,
            proxy=None if proxy is None else _httpx_proxy(upstream, proxy, env),
            trust_env=False,  # the environment was read here, once
        )
    )


def _httpx_proxy(upstream: Upstream, url: str, env: Mapping[str, str] | None) -> httpx2.Proxy:
    if url.startswith("https://"):  # its own certificate is checked as the upstream's
        return httpx2.Proxy(url, ssl_context=tls_context(upstream, env))
    return httpx2.Proxy(url)


class HttpcoreErrors(httpx2.AsyncBaseTransport):
    """httpx2's transport, with what httpcore2 lets through as httpx2's errors: a GOAWAY
    received on a connection's later stream raises ``httpcore2.ConnectionNotAvailable``
    (as in httpcore 1.0, encode/httpcore#733; still so in httpcore2 2.16), which httpx2's
    error map leaves out; it is a connection the server ended, a ``RemoteProtocolError``
    (section 3: an interruption)."""

    def __init__(self, transport: httpx2.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self._transport.handle_async_request(request)
        except httpcore2.ConnectionNotAvailable as exc:
            raise httpx2.RemoteProtocolError(str(exc) or "connection not available") from None
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _MappedStream(response.stream)
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()


class _MappedStream(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except httpcore2.ConnectionNotAvailable as exc:
            raise httpx2.RemoteProtocolError(str(exc) or "connection not available") from None

    async def aclose(self) -> None:
        await self._stream.aclose()


def _system_context(*, shared: bool = True) -> ssl.SSLContext:
    """The operating system's trust store (httpx2's default, the environment left out:
    ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` were read above, once). ``shared``: the one
    context every default upstream uses (never changed after it is made)."""
    if shared:
        return _shared_system_context()
    return httpx2.create_ssl_context(trust_env=False)


@functools.cache
def _shared_system_context() -> ssl.SSLContext:
    return httpx2.create_ssl_context(trust_env=False)
