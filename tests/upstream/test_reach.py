"""How an upstream is reached, from its config and the environment (pure: no sockets)."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from pydantic import SecretStr

from gateway.config.load import parse_config
from gateway.config.schema import ConfigError, Upstream, mask_url
from gateway.upstream.reach import bypassed, reach_of, tls_context


def upstream(**fields: Any) -> Upstream:
    base = {"name": "u", "base_url": "https://api.example.com/v1"}
    return parse_config({"upstreams": [base | fields]}).upstreams[0]


def proxy_of(up: Upstream, env: dict[str, str]) -> str | None:
    reach = reach_of(up, env)
    return None if reach.proxy is None else reach.proxy.get_secret_value()


def test_the_environment_is_read_as_curl_reads_it() -> None:
    up = upstream()
    assert proxy_of(up, {}) is None
    assert proxy_of(up, {"HTTPS_PROXY": "http://p:1"}) == "http://p:1"
    assert proxy_of(up, {"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:1"}) == (
        "http://low:1"  # lower case first
    )
    assert proxy_of(up, {"HTTP_PROXY": "http://p:1"}) is None  # not for an https upstream
    assert proxy_of(upstream(base_url="http://x/v1"), {"HTTP_PROXY": "http://p:1"}) == "http://p:1"
    assert proxy_of(up, {"ALL_PROXY": "http://all:1"}) == "http://all:1"
    assert proxy_of(up, {"HTTPS_PROXY": "proxy.corp:3128"}) == "http://proxy.corp:3128"


def test_an_upstreams_own_proxy_wins_and_null_goes_direct() -> None:
    env = {"HTTPS_PROXY": "http://env:1"}
    assert proxy_of(upstream(proxy="http://own:2"), env) == "http://own:2"
    direct = reach_of(upstream(proxy=None), env)
    assert direct.proxy is None and direct.proxy_source == "proxy: null"


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypass"),
    [
        ("api.example.com", 443, "*", True),
        ("api.example.com", 443, "example.com", True),
        ("api.example.com", 443, ".example.com", True),
        ("example.com", 443, ".example.com", True),
        ("badexample.com", 443, "example.com", False),
        ("api.example.com", 443, "other.com, example.com", True),
        ("api.example.com", 443, "example.com:8443", False),
        ("api.example.com", 8443, "example.com:8443", True),
        ("10.1.2.3", 443, "10.0.0.0/8", True),
        ("10.1.2.3", 443, "192.168.0.0/16", False),
        ("127.0.0.1", 80, "127.0.0.1", True),
        ("::1", 80, "::1", True),
        ("api.example.com", 443, "", False),
    ],
)
def test_no_proxy(host: str, port: int, no_proxy: str, bypass: bool) -> None:
    assert bypassed(host, port, no_proxy) is bypass


def test_no_proxy_makes_an_upstream_direct() -> None:
    env = {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "localhost,.example.com"}
    reach = reach_of(upstream(), env)
    assert reach.proxy is None and reach.proxy_source == "NO_PROXY"


def test_the_engine_is_the_builtin_one_unless_http2_or_a_tls_proxy_needs_httpx() -> None:
    assert reach_of(upstream(), {}).engine == "builtin"
    assert reach_of(upstream(), {"HTTPS_PROXY": "http://p:1"}).engine == "builtin"
    assert reach_of(upstream(), {"HTTPS_PROXY": "https://p:1"}).engine == "httpx"
    assert reach_of(upstream(http2=True), {}).engine == "httpx"
    assert reach_of(upstream(engine="httpx"), {}).engine == "httpx"


def test_an_engine_that_cannot_do_what_is_asked_is_refused() -> None:
    with pytest.raises(Exception, match="HTTP/1.1 only"):
        upstream(engine="builtin", http2=True)
    with pytest.raises(Exception, match="cannot use an https:// proxy"):
        upstream(engine="builtin", proxy="https://p:1")
    with pytest.raises(Exception, match="client_key needs a client_cert"):
        upstream(tls={"client_key": "/k.pem"})


def test_engine_aiohttp_is_refused_saying_why() -> None:
    """httpx-aiohttp works with httpx, not httpx2: a config that names it is told so."""
    with pytest.raises(ConfigError, match="engine aiohttp is no longer offered.*httpx2"):
        upstream(engine="aiohttp")


def test_check_config_shows_the_way_with_credentials_masked() -> None:
    reach = reach_of(upstream(proxy="http://user:s3cret@corp:3128"), {})
    line = reach.describe()
    assert "s3cret" not in line and "user:****@corp:3128" in line
    assert line.startswith("via proxy") and "HTTP/1.1 (builtin engine)" in line
    assert "CAs: the system store" in reach_of(upstream(), {}).describe()
    assert "SSL_CERT_FILE=/ca.pem" in reach_of(upstream(), {"SSL_CERT_FILE": "/ca.pem"}).ca
    assert reach_of(upstream(tls={"verify": False}), {}).ca == "none (verify: false)"


def test_a_proxy_url_is_validated_and_never_echoed() -> None:
    with pytest.raises(Exception) as raised:
        upstream(proxy="socks9://user:s3cret@p:1")
    assert "s3cret" not in str(raised.value) and "proxy" in str(raised.value)


def test_a_no_proxy_port_is_matched_against_the_schemes_default() -> None:
    env = {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.example.com:8443"}
    assert proxy_of(upstream(), env) == "http://p:1"  # https://api.example.com is :443
    assert proxy_of(upstream(base_url="https://api.example.com:8443/v1"), env) is None
    assert proxy_of(upstream(), env | {"no_proxy": "", "NO_PROXY": "*"}) is None


def test_a_proxy_the_engine_cannot_use_stops_start_up_with_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"socks5:// proxy.*only http:// and https://"):
        reach_of(upstream(), {"ALL_PROXY": "socks5://user:pw@h:1080"})
    with pytest.raises(ConfigError, match="engine builtin cannot use the https:// proxy"):
        reach_of(upstream(engine="builtin"), {"HTTPS_PROXY": "https://p:1"})
    assert "pw" not in str(_error(lambda: reach_of(upstream(), {"ALL_PROXY": "socks5://u:pw@h"})))


def test_http2_is_negotiated_by_tls_so_an_http_upstream_speaks_1_1() -> None:
    reach = reach_of(upstream(base_url="http://vllm:8000/v1", http2=True), {})
    assert (reach.http2, reach.engine) == (False, "builtin")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://TOKEN@proxy:3128", "http://****@proxy:3128"),
        ("http://user:ab/cd@proxy:3128", "http://user:****@proxy:3128"),
        ("http://user:p%40ss@proxy:3128", "http://user:****@proxy:3128"),
        ("http://proxy:3128", "http://proxy:3128"),
    ],
)
def test_credentials_are_masked_whatever_a_parser_makes_of_them(url: str, shown: str) -> None:
    assert mask_url(SecretStr(url)) == shown


def _error(call: Callable[[], object]) -> Exception:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test reads its message
        return exc
    raise AssertionError("no error")


# -- which CAs are trusted ----------------------------------------------------------------


def _cas(context: ssl.SSLContext) -> set[bytes]:
    return {bytes(cert) for cert in context.get_ca_certs(binary_form=True)}


@pytest.fixture
def system_cas(monkeypatch: pytest.MonkeyPatch) -> set[bytes]:
    """What the operating system trusts: OpenSSL's compiled-in CA file and directory,
    read without the environment variables that would override them."""
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    paths = ssl.get_default_verify_paths()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if Path(paths.openssl_cafile).is_file():
        context.load_verify_locations(cafile=paths.openssl_cafile)
    cas = _cas(context)
    if not cas:
        pytest.fail(f"this machine has no CA file at {paths.openssl_cafile}: nothing to compare")
    return cas


@pytest.mark.parametrize("engine", ["builtin", "httpx"])
def test_nothing_configured_trusts_the_system_store_on_every_engine(
    system_cas: set[bytes], engine: str
) -> None:
    """httpx2's default (the OS's store), not certifi's bundle; the same on both engines."""
    up = upstream(engine=engine)
    assert reach_of(up, {}).ca == "the system store"
    context = tls_context(up, {})
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert _cas(context) == system_cas


def test_ca_file_and_ssl_cert_file_replace_the_system_store(
    system_cas: set[bytes], tmp_path: Path
) -> None:
    ca = trustme.CA()
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    private = {ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode())}
    assert _cas(tls_context(upstream(tls={"ca_file": str(pem)}), {})) == private
    assert _cas(tls_context(upstream(), {"SSL_CERT_FILE": str(pem)})) == private
    # ca_file wins over the environment.
    other = tmp_path / "other.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    both = tls_context(upstream(tls={"ca_file": str(pem)}), {"SSL_CERT_FILE": str(other)})
    assert _cas(both) == private
