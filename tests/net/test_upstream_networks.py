"""The gateway on real networks: through forward proxies, to private-CA and mutual-TLS
upstreams, over HTTP/2 with GOAWAY and RST_STREAM mid-stream. Every test asserts the
exact answer arrived (the openai SDK as the client) and, for a proxy, that the
request really went through it."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.config.load import parse_config
from gateway.config.schema import GatewayConfig
from tests.net.conftest import PROXY_PASSWORD, PROXY_USER
from tests.net.h2_upstream import H2Upstream
from tests.net.pki import Pki
from tests.net.proxy import ForwardProxy, ProxiedRequest
from tests.servers import running_gateway

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "idle_retry_delay": 0.01}
ASK: list[Any] = [{"role": "user", "content": "Tell me."}]


def config(base_url: str, *, fallback: str | None = None, **upstream: Any) -> GatewayConfig:
    upstreams = [
        {"name": "up", "base_url": base_url, "timeouts": {"connect": 2, "first_byte": 5, "idle": 2}}
        | upstream
    ]
    route: dict[str, Any] = {"match": "*", "upstream": "up", "retry": FAST_RETRY}
    if fallback is not None:
        upstreams.append({"name": "fallback", "base_url": fallback, "proxy": None})
        route["fallbacks"] = [{"upstream": "fallback"}]
    return parse_config({"upstreams": upstreams, "routes": [route]})


@pytest.fixture(params=["builtin", "httpx"])
def engine(request: pytest.FixtureRequest) -> str:
    """Both engines that can reach an HTTP/1.1 upstream through a proxy and over TLS:
    the config means the same whichever serves."""
    value: str = request.param
    return value


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No proxy or CA variable from the machine leaks into a test."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    yield monkeypatch


def streamed(settings: GatewayConfig, model: str) -> str:
    """The text of a streamed chat completion through a gateway with ``settings``."""
    with running_gateway(settings) as gateway:
        with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
            chunks = client.chat.completions.create(model=model, messages=ASK, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def refused(settings: GatewayConfig, model: str) -> openai.APIStatusError:
    with running_gateway(settings) as gateway:
        with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
            with pytest.raises(openai.APIStatusError) as raised:
                client.chat.completions.create(model=model, messages=ASK, stream=True)
    return raised.value


# -- proxies ----------------------------------------------------------------------------


def test_an_https_upstream_through_a_proxy_is_a_connect_tunnel(
    engine: str,
    no_proxy_env: pytest.MonkeyPatch,
    tls_chaos: ChaosUpstream,
    proxy: ForwardProxy,
    pki: Pki,
) -> None:
    model = "chaos:text=30,seed=1,fault=reset,at=12,times=1"
    settings = config(
        tls_chaos.base_url, proxy=proxy.url, tls={"ca_file": str(pki.ca_cert)}, engine=engine
    )
    assert streamed(settings, model) == expected_answer(model).text
    tunnel = ProxiedRequest("CONNECT", f"127.0.0.1:{tls_chaos.port}", None)
    assert proxy.requests == [tunnel, tunnel]  # the continuation went through it too
    assert len(tls_chaos.requests_for(model)) == 2


def test_proxy_credentials_go_as_proxy_authorization_and_never_to_the_client(
    engine: str,
    no_proxy_env: pytest.MonkeyPatch,
    tls_chaos: ChaosUpstream,
    auth_proxy: ForwardProxy,
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = "chaos:text=12,seed=2"
    tls = {"ca_file": str(pki.ca_cert)}
    good = config(tls_chaos.base_url, proxy=auth_proxy.url_with_credentials, tls=tls, engine=engine)
    with caplog.at_level(logging.DEBUG):
        assert streamed(good, model) == expected_answer(model).text
    (request,) = auth_proxy.requests
    assert request.method == "CONNECT" and request.authorization is not None
    assert request.authorization.startswith("Basic ")
    wrong_url = auth_proxy.url_with_credentials.replace("s3cr", "wrong")
    error = refused(config(tls_chaos.base_url, proxy=wrong_url, tls=tls, engine=engine), model)
    assert error.status_code == 502 and "could not be reached" in error.message
    assert PROXY_PASSWORD not in caplog.text and "s3cr%2Ft" not in caplog.text
    assert request.authorization not in caplog.text  # nor its Basic encoding
    assert PROXY_PASSWORD not in error.message and PROXY_USER not in error.message


def test_a_plain_http_upstream_through_a_proxy_is_forwarded(
    engine: str, no_proxy_env: pytest.MonkeyPatch, chaos: ChaosUpstream, proxy: ForwardProxy
) -> None:
    model = f"chaos:text=20,seed=3{len(engine)},fault=close,at=7,times=1"  # times= per string

    assert (
        streamed(config(chaos.base_url, proxy=proxy.url, engine=engine), model)
        == expected_answer(model).text
    )
    targets = {(r.method, r.target) for r in proxy.requests}
    # The continuation's look at what the server takes (continuation: auto) goes the
    # same way as every request to the upstream.
    assert targets == {
        ("POST", f"{chaos.base_url}/chat/completions"),
        ("GET", f"{chaos.base_url}/models"),
    }
    assert len(chaos.requests_for(model)) == 2  # the break, and its continuation


def test_the_environment_proxy_is_used_unless_no_proxy_names_the_host(
    engine: str,
    no_proxy_env: pytest.MonkeyPatch,
    tls_chaos: ChaosUpstream,
    proxy: ForwardProxy,
    pki: Pki,
) -> None:
    model = "chaos:text=10,seed=4"
    no_proxy_env.setenv("HTTPS_PROXY", proxy.url)
    settings = config(tls_chaos.base_url, tls={"ca_file": str(pki.ca_cert)}, engine=engine)
    assert streamed(settings, model) == expected_answer(model).text
    assert [r.method for r in proxy.requests] == ["CONNECT"]
    no_proxy_env.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert streamed(settings, model) == expected_answer(model).text
    assert len(proxy.requests) == 1  # direct this time
    direct = config(
        tls_chaos.base_url, proxy=None, tls={"ca_file": str(pki.ca_cert)}, engine=engine
    )
    no_proxy_env.delenv("NO_PROXY")
    assert streamed(direct, model) == expected_answer(model).text  # proxy: null wins
    assert len(proxy.requests) == 1


@pytest.mark.parametrize("mode", ["refuse", "drop"])
def test_a_proxy_that_refuses_or_drops_is_a_connect_error_and_the_next_leg_answers(
    engine: str,
    no_proxy_env: pytest.MonkeyPatch,
    tls_chaos: ChaosUpstream,
    chaos: ChaosUpstream,
    proxy: ForwardProxy,
    pki: Pki,
    mode: str,
) -> None:
    proxy.mode = mode  # type: ignore[assignment]
    # The session's chaos upstream records every test's requests: a model of its own.
    model = f"chaos:text=10,seed={5 if mode == 'refuse' else 15}{len(engine)}"
    tls = {"ca_file": str(pki.ca_cert)}
    settings = config(
        tls_chaos.base_url, proxy=proxy.url, tls=tls, fallback=chaos.base_url, engine=engine
    )
    assert streamed(settings, model) == expected_answer(model).text
    assert len(proxy.requests) == 3  # tried, retried twice, then the next leg
    assert tls_chaos.requests_for(model) == []
    assert len(chaos.requests_for(model)) == 1


# -- TLS --------------------------------------------------------------------------------


def test_a_private_ca_is_trusted_from_ca_file_or_ssl_cert_file_and_not_otherwise(
    engine: str, no_proxy_env: pytest.MonkeyPatch, tls_chaos: ChaosUpstream, pki: Pki
) -> None:
    model = "chaos:text=10,seed=6"
    no_proxy_env.delenv("SSL_CERT_FILE", raising=False)
    error = refused(config(tls_chaos.base_url, engine=engine), model)
    assert error.status_code == 502 and "could not be reached" in error.message
    settings = config(tls_chaos.base_url, tls={"ca_file": str(pki.ca_cert)}, engine=engine)
    assert streamed(settings, model) == expected_answer(model).text
    no_proxy_env.setenv("SSL_CERT_FILE", str(pki.ca_cert))
    assert streamed(config(tls_chaos.base_url, engine=engine), model) == expected_answer(model).text


def test_verify_false_trusts_anything_and_warns(
    no_proxy_env: pytest.MonkeyPatch, tls_chaos: ChaosUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    model = "chaos:text=10,seed=7"
    with caplog.at_level(logging.WARNING, logger="gateway.upstream"):
        settings = config(tls_chaos.base_url, tls={"verify": False})
        assert streamed(settings, model) == expected_answer(model).text
    assert "not verified" in caplog.text


def test_mutual_tls_needs_the_client_certificate(
    engine: str, no_proxy_env: pytest.MonkeyPatch, mtls_chaos: ChaosUpstream, pki: Pki
) -> None:
    model = "chaos:text=10,seed=8,fault=reset,at=4,times=1"
    without = config(mtls_chaos.base_url, tls={"ca_file": str(pki.ca_cert)}, engine=engine)
    assert refused(without, model).status_code == 502
    with_cert = config(
        mtls_chaos.base_url,
        tls={
            "ca_file": str(pki.ca_cert),
            "client_cert": str(pki.client_cert),
            "client_key": str(pki.client_key),
        },
        engine=engine,
    )
    assert streamed(with_cert, model) == expected_answer(model).text


# -- HTTP/2 -----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["goaway", "rst_stream"])
@pytest.mark.parametrize("at", [0, 9, 29], ids=["before-content", "mid-text", "last"])
def test_goaway_and_rst_stream_mid_stream_are_recovered_byte_exact(
    no_proxy_env: pytest.MonkeyPatch, h2_upstream: H2Upstream, pki: Pki, fault: str, at: int
) -> None:
    model = f"chaos:text=30,seed=9,fault={fault},at={at},times=1"
    settings = config(h2_upstream.base_url, http2=True, tls={"ca_file": str(pki.ca_cert)})
    assert streamed(settings, model) == expected_answer(model).text
    requests = h2_upstream.requests_for(model)
    assert [r.http_version for r in requests] == ["2", "2"]
    assert [r.fault for r in requests] == [fault, None]


def test_a_goaway_on_a_later_stream_of_a_connection_is_recovered_too(
    no_proxy_env: pytest.MonkeyPatch, h2_upstream: H2Upstream, pki: Pki
) -> None:
    """httpcore raises its own ConnectionNotAvailable there, which the gateway maps."""
    settings = config(h2_upstream.base_url, http2=True, tls={"ca_file": str(pki.ca_cert)})
    with running_gateway(settings) as gateway:
        with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
            texts = []
            for model in (
                "chaos:text=8,seed=10",
                "chaos:text=20,seed=11,fault=goaway,at=6,times=1",
            ):
                chunks = client.chat.completions.create(model=model, messages=ASK, stream=True)
                texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert texts == [expected_answer("chaos:text=8,seed=10").text,
                     expected_answer("chaos:text=20,seed=11").text]  # fmt: skip
    first, faulted = h2_upstream.requests[0], h2_upstream.requests[1]
    assert faulted.connection == first.connection and faulted.stream_id > 1
    assert faulted.fault == "goaway"


def test_ssl_cert_dir_is_honoured(
    engine: str,
    no_proxy_env: pytest.MonkeyPatch,
    tls_chaos: ChaosUpstream,
    pki: Pki,
    tmp_path: Path,
) -> None:
    """A directory of CA certificates named by their subject hash (``openssl rehash``)."""
    subject_hash = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(pki.ca_cert)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (tmp_path / f"{subject_hash}.0").write_bytes(pki.ca_cert.read_bytes())
    no_proxy_env.delenv("SSL_CERT_FILE", raising=False)
    no_proxy_env.setenv("SSL_CERT_DIR", str(tmp_path))
    model = "chaos:text=10,seed=12"
    assert streamed(config(tls_chaos.base_url, engine=engine), model) == expected_answer(model).text


def test_an_https_proxy_is_spoken_to_over_tls_checked_like_the_upstream(
    no_proxy_env: pytest.MonkeyPatch, tls_chaos: ChaosUpstream, tls_proxy: ForwardProxy, pki: Pki
) -> None:
    """TLS to the proxy itself, then a tunnel with TLS to the upstream inside it: httpx's
    engine (``auto`` picks it), both certificates from the configured CA."""
    model = "chaos:text=20,seed=13,fault=reset,at=8,times=1"
    settings = config(tls_chaos.base_url, proxy=tls_proxy.url, tls={"ca_file": str(pki.ca_cert)})
    assert streamed(settings, model) == expected_answer(model).text
    assert [r.method for r in tls_proxy.requests] == ["CONNECT", "CONNECT"]
    assert len(tls_chaos.requests_for(model)) == 2
