"""The network fixtures work, seen by a plain client (httpx): TLS with a private CA, mutual
TLS, a forward proxy (CONNECT and absolute-form, Basic credentials, refusals), HTTP/2."""

from __future__ import annotations

import base64
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpcore2
import httpx2
import orjson
import pytest

from gateway.chaos import ChaosUpstream, expected_answer
from tests.net.conftest import PROXY_PASSWORD, PROXY_USER
from tests.net.h2_upstream import H2Upstream
from tests.net.pki import Pki
from tests.net.proxy import ForwardProxy, ProxiedRequest

TIMEOUT = 10.0


def chat(model: str, *, stream: bool = True, messages: list[dict[str, str]] | None = None) -> Any:
    conversation = messages or [{"role": "user", "content": "Say something."}]
    return {"model": model, "stream": stream, "messages": conversation}


def deltas(lines: Iterator[str], into: list[str] | None = None) -> list[str]:
    """The content deltas of a chat SSE stream, appended to ``into`` as they come."""
    found = [] if into is None else into
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in orjson.loads(line[len("data: ") :])["choices"]:
                if content := choice["delta"].get("content"):
                    found.append(content)
    return found


def stream_text(client: httpx2.Client, base_url: str, model: str) -> str:
    with client.stream("POST", f"{base_url}/chat/completions", json=chat(model)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return "".join(deltas(response.iter_lines()))


# -- TLS and mutual TLS ------------------------------------------------------------------


def test_pki_files_are_pem(pki: Pki, ca_cert_path: str, client_cert_path: str) -> None:
    assert ca_cert_path == str(pki.ca_cert)
    assert pki.ca_cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert b"PRIVATE KEY" in pki.client_key.read_bytes()
    assert b"CERTIFICATE" in pki.client_pem.read_bytes()
    assert b"PRIVATE KEY" in pki.client_pem.read_bytes()
    assert client_cert_path == str(pki.client_cert)


def test_tls_chaos_is_verified_by_the_private_ca(tls_chaos: ChaosUpstream, pki: Pki) -> None:
    assert tls_chaos.base_url.startswith("https://127.0.0.1:")
    with httpx2.Client(verify=pki.client_context(), timeout=TIMEOUT) as client:
        text = stream_text(client, tls_chaos.base_url, "chaos:text=8")
    assert text == expected_answer("chaos:text=8").text
    assert [r.path for r in tls_chaos.requests] == ["/v1/chat/completions"]


def test_tls_chaos_is_refused_by_another_ca(tls_chaos: ChaosUpstream, pki: Pki) -> None:
    stranger = ssl.create_default_context(cafile=str(pki.stranger_ca_cert))
    with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx2.get(f"{tls_chaos.base_url}/models", verify=stranger, timeout=TIMEOUT)
    assert tls_chaos.requests == []


def test_tls_chaos_faults_still_break_the_stream(tls_chaos: ChaosUpstream, pki: Pki) -> None:
    got: list[str] = []
    with httpx2.Client(verify=pki.client_context(), timeout=TIMEOUT) as client:
        url = f"{tls_chaos.base_url}/chat/completions"
        body = chat("chaos:text=8,fault=close,at=3")
        with pytest.raises(httpx2.RemoteProtocolError), client.stream("POST", url, json=body) as r:
            deltas(r.iter_lines(), got)
    assert len(got) == 3
    assert "".join(got) == expected_answer("chaos:text=8").text[: len("".join(got))]


def test_mtls_chaos_refuses_a_client_without_a_certificate(
    mtls_chaos: ChaosUpstream, pki: Pki
) -> None:
    # TLS 1.3: the client's handshake is over before the server checks; the refusal is
    # the server's alert, then a closed connection, where the response should be.
    with pytest.raises((httpx2.ConnectError, httpx2.ReadError, httpx2.RemoteProtocolError)):
        httpx2.get(f"{mtls_chaos.base_url}/models", verify=pki.client_context(), timeout=TIMEOUT)
    assert mtls_chaos.requests == []


def test_mtls_chaos_refuses_a_certificate_from_another_ca(
    mtls_chaos: ChaosUpstream, pki: Pki
) -> None:
    context = pki.client_context()
    context.load_cert_chain(str(pki.stranger_client_pem))
    with pytest.raises((httpx2.ConnectError, httpx2.ReadError, httpx2.RemoteProtocolError)):
        httpx2.get(f"{mtls_chaos.base_url}/models", verify=context, timeout=TIMEOUT)
    assert mtls_chaos.requests == []


def test_mtls_chaos_accepts_the_client_certificate(
    mtls_chaos: ChaosUpstream, pki: Pki, client_cert_path: str, client_key_path: str
) -> None:
    context = pki.client_context()
    context.load_cert_chain(client_cert_path, client_key_path)
    with httpx2.Client(verify=context, timeout=TIMEOUT) as client:
        assert stream_text(client, mtls_chaos.base_url, "chaos:text=5") == (
            expected_answer("chaos:text=5").text
        )
    combined = pki.client_context()
    combined.load_cert_chain(str(pki.client_pem))  # chain and key in one file
    response = httpx2.get(f"{mtls_chaos.base_url}/models", verify=combined, timeout=TIMEOUT)
    assert response.status_code == 200


# -- the forward proxy -------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_proxy_tunnels_https_with_connect(
    proxy: ForwardProxy, tls_chaos: ChaosUpstream, pki: Pki
) -> None:
    with httpx2.Client(proxy=proxy.url, verify=pki.client_context(), timeout=TIMEOUT) as client:
        assert stream_text(client, tls_chaos.base_url, "chaos:text=6") == (
            expected_answer("chaos:text=6").text
        )
    assert proxy.requests == [ProxiedRequest("CONNECT", f"127.0.0.1:{tls_chaos.port}", None)]
    assert len(tls_chaos.requests) == 1


def test_proxy_forwards_http_in_absolute_form(proxy: ForwardProxy, chaos: ChaosUpstream) -> None:
    chaos.requests.clear()
    with httpx2.Client(proxy=proxy.url, timeout=TIMEOUT) as client:
        assert stream_text(client, chaos.base_url, "chaos:text=6") == (
            expected_answer("chaos:text=6").text
        )
    url = f"{chaos.base_url}/chat/completions"
    assert proxy.requests == [ProxiedRequest("POST", url, None)]
    (seen,) = chaos.requests
    assert seen.path == "/v1/chat/completions" and seen.body["model"] == "chaos:text=6"
    assert seen.headers["connection"] == "close" and "proxy-authorization" not in seen.headers


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_proxy_does_not_buffer_a_stream(
    scheme: str, proxy: ForwardProxy, request: pytest.FixtureRequest, pki: Pki
) -> None:
    upstream: ChaosUpstream = request.getfixturevalue("tls_chaos" if scheme == "https" else "chaos")
    # 7 events (role, 4 deltas, finish, [DONE]) 250 ms apart: 1.5 s in all.
    model = "chaos:text=4,pace_ms=250"
    arrivals: list[float] = []
    with httpx2.Client(proxy=proxy.url, verify=pki.client_context(), timeout=TIMEOUT) as client:
        start = time.monotonic()
        url = f"{upstream.base_url}/chat/completions"
        with client.stream("POST", url, json=chat(model)) as response:
            for _ in deltas(response.iter_lines(), _Stamped(arrivals, start)):
                pass
    assert len(arrivals) == 4
    # Buffered, they would all come at the end; as sent, the last comes 750 ms after the first.
    assert arrivals[-1] - arrivals[0] > 0.5, arrivals


class _Stamped(list[str]):
    """A list that notes when each item was appended (seconds since ``start``)."""

    def __init__(self, stamps: list[float], start: float) -> None:
        super().__init__()
        self._stamps, self._start = stamps, start

    def append(self, item: str) -> None:
        self._stamps.append(time.monotonic() - self._start)
        super().append(item)


def test_proxy_passes_on_a_reset_and_a_close(proxy: ForwardProxy, chaos: ChaosUpstream) -> None:
    url = f"{chaos.base_url}/chat/completions"
    with httpx2.Client(proxy=proxy.url, timeout=TIMEOUT) as client:
        with (
            pytest.raises(httpx2.ReadError),
            client.stream("POST", url, json=chat("chaos:fault=reset")) as r,
        ):
            deltas(r.iter_lines())
        with (
            pytest.raises(httpx2.RemoteProtocolError),
            client.stream("POST", url, json=chat("chaos:fault=close")) as r,
        ):
            deltas(r.iter_lines())


def test_auth_proxy_takes_basic_credentials(
    auth_proxy: ForwardProxy, tls_chaos: ChaosUpstream, chaos: ChaosUpstream, pki: Pki
) -> None:
    chaos.requests.clear()
    assert auth_proxy.url_with_credentials == (
        f"http://{PROXY_USER}:s3cr%2Ft%40proxy@127.0.0.1:{auth_proxy.port}"
    )
    proxied = auth_proxy.url_with_credentials
    with httpx2.Client(proxy=proxied, verify=pki.client_context(), timeout=TIMEOUT) as client:
        assert client.get(f"{tls_chaos.base_url}/models").status_code == 200
        assert client.get(f"{chaos.base_url}/models").status_code == 200
    credentials = basic(PROXY_USER, PROXY_PASSWORD)
    assert auth_proxy.requests == [
        ProxiedRequest("CONNECT", f"127.0.0.1:{tls_chaos.port}", credentials),
        ProxiedRequest("GET", f"{chaos.base_url}/models", credentials),
    ]
    assert "proxy-authorization" not in chaos.requests[0].headers


@pytest.mark.parametrize("password", [None, "wrong"])
def test_auth_proxy_answers_407_without_the_credentials(
    password: str | None,
    auth_proxy: ForwardProxy,
    tls_chaos: ChaosUpstream,
    chaos: ChaosUpstream,
    pki: Pki,
) -> None:
    url = auth_proxy.url
    if password is not None:
        url = f"http://{PROXY_USER}:{password}@127.0.0.1:{auth_proxy.port}"
    with httpx2.Client(proxy=url, verify=pki.client_context(), timeout=TIMEOUT) as client:
        with pytest.raises(httpx2.ProxyError, match="407"):
            client.get(f"{tls_chaos.base_url}/models")
        response = client.get(f"{chaos.base_url}/models")
    assert response.status_code == 407
    assert response.headers["proxy-authenticate"].startswith("Basic ")
    assert tls_chaos.requests == []
    sent = None if password is None else basic(PROXY_USER, password)
    assert [r.authorization for r in auth_proxy.requests] == [sent, sent]


def test_refusing_proxy_answers_403(
    proxy: ForwardProxy, tls_chaos: ChaosUpstream, pki: Pki
) -> None:
    proxy.mode = "refuse"
    with httpx2.Client(proxy=proxy.url, verify=pki.client_context(), timeout=TIMEOUT) as client:
        with pytest.raises(httpx2.ProxyError, match="403"):
            client.get(f"{tls_chaos.base_url}/models")
    assert proxy.requests == [ProxiedRequest("CONNECT", f"127.0.0.1:{tls_chaos.port}", None)]
    assert tls_chaos.requests == []


def test_dropping_proxy_closes_the_connection(
    proxy: ForwardProxy, tls_chaos: ChaosUpstream, pki: Pki
) -> None:
    proxy.mode = "drop"
    with httpx2.Client(proxy=proxy.url, verify=pki.client_context(), timeout=TIMEOUT) as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            client.get(f"{tls_chaos.base_url}/models")
    assert len(proxy.requests) == 1 and tls_chaos.requests == []


def test_proxy_answers_502_for_an_unreachable_upstream(proxy: ForwardProxy, pki: Pki) -> None:
    with httpx2.Client(proxy=proxy.url, verify=pki.client_context(), timeout=TIMEOUT) as client:
        with pytest.raises(httpx2.ProxyError, match="502"):
            client.get("https://127.0.0.1:1/v1/models")
        assert client.get("http://127.0.0.1:1/v1/models").status_code == 502


def test_tls_proxy_is_an_https_proxy(
    tls_proxy: ForwardProxy, tls_chaos: ChaosUpstream, chaos: ChaosUpstream, pki: Pki
) -> None:
    assert tls_proxy.url.startswith("https://127.0.0.1:")
    to_proxy = httpx2.Proxy(tls_proxy.url, ssl_context=pki.client_context())
    with httpx2.Client(proxy=to_proxy, verify=pki.client_context(), timeout=TIMEOUT) as client:
        assert client.get(f"{tls_chaos.base_url}/models").status_code == 200  # TLS in TLS
        assert client.get(f"{chaos.base_url}/models").status_code == 200
    assert [r.method for r in tls_proxy.requests] == ["CONNECT", "GET"]


# -- the HTTP/2 upstream -----------------------------------------------------------------


@pytest.fixture
def h2_client(pki: Pki) -> Iterator[httpx2.Client]:
    with httpx2.Client(http2=True, verify=pki.client_context(), timeout=TIMEOUT) as client:
        yield client


def test_h2_upstream_streams_over_http2(h2_upstream: H2Upstream, h2_client: httpx2.Client) -> None:
    assert h2_upstream.base_url.startswith("https://127.0.0.1:")
    url = f"{h2_upstream.base_url}/chat/completions"
    with h2_client.stream("POST", url, json=chat("chaos:text=10,seed=2")) as response:
        assert response.http_version == "HTTP/2"
        assert response.headers["content-type"] == "text/event-stream"
        text = "".join(deltas(response.iter_lines()))
    assert text == expected_answer("chaos:text=10,seed=2").text
    (seen,) = h2_upstream.requests
    assert (seen.method, seen.path, seen.http_version, seen.stream_id) == (
        "POST",
        "/v1/chat/completions",
        "2",
        1,
    )
    assert seen.body["model"] == "chaos:text=10,seed=2" and seen.fault is None
    assert seen.headers["content-type"] == "application/json"


def test_h2_upstream_refuses_http1(h2_upstream: H2Upstream, pki: Pki) -> None:
    with pytest.raises(httpx2.RemoteProtocolError):
        httpx2.get(f"{h2_upstream.base_url}/models", verify=pki.client_context(), timeout=TIMEOUT)


@pytest.mark.parametrize("cut", [0, 7, 23])
def test_h2_upstream_answers_as_the_chaos_upstream(
    cut: int, h2_upstream: H2Upstream, h2_client: httpx2.Client, chaos: ChaosUpstream
) -> None:
    """The same deltas as the HTTP/1.1 chaos upstream, fresh or continuing a prefix (cut
    mid-delta) with a prompt-mode anchor."""
    model = "chaos:text=12,seed=5"
    text = expected_answer(model).text
    messages = [{"role": "user", "content": "Say something."}]
    if cut:
        anchor = text[cut - 5 : cut]
        messages += [
            {"role": "assistant", "content": text[:cut]},
            {"role": "user", "content": f"Continue after <<<{anchor}>>>"},
        ]
    body = chat(model, messages=messages)
    said: list[list[str]] = []
    with httpx2.Client(timeout=TIMEOUT) as http1:
        for client, base_url in ((h2_client, h2_upstream.base_url), (http1, chaos.base_url)):
            with client.stream("POST", f"{base_url}/chat/completions", json=body) as r:
                said.append(deltas(r.iter_lines()))
    assert said[0] == said[1]
    expected = (text[cut - 5 : cut] if cut else "") + text[cut:]
    assert "".join(said[0]) == expected
    assert h2_upstream.requests[0].prefix == text[:cut]


def test_h2_upstream_serves_http_faults_and_json(
    h2_upstream: H2Upstream, h2_client: httpx2.Client
) -> None:
    url = f"{h2_upstream.base_url}/chat/completions"
    limited = h2_client.post(url, json=chat("chaos:fault=http_429_retry,retry_after=3"))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
    whole = h2_client.post(url, json=chat("chaos:text=4", stream=False))
    assert whole.http_version == "HTTP/2"
    assert whole.json()["choices"][0]["message"]["content"] == expected_answer("chaos:text=4").text


def broken_at_3_then_spared(
    h2_upstream: H2Upstream, h2_client: httpx2.Client, model: str, match: str
) -> None:
    """``model``'s stream breaks with ``match`` after its 3rd delta; asked again (its
    fault has ``times=1``), it is whole."""
    url = f"{h2_upstream.base_url}/chat/completions"
    got: list[str] = []
    with pytest.raises(httpx2.RemoteProtocolError, match=match):
        with h2_client.stream("POST", url, json=chat(model)) as response:
            deltas(response.iter_lines(), got)
    assert len(got) == 3
    assert "".join(got) == expected_answer(model).text[: len("".join(got))]
    with h2_client.stream("POST", url, json=chat(model)) as response:  # times=1: spared
        assert "".join(deltas(response.iter_lines())) == expected_answer(model).text


def test_h2_goaway_breaks_the_stream_and_the_connection(
    h2_upstream: H2Upstream, h2_client: httpx2.Client
) -> None:
    model = "chaos:text=10,fault=goaway,at=3,times=1"
    broken_at_3_then_spared(h2_upstream, h2_client, model, "ConnectionTerminated")
    first, second = h2_upstream.requests
    assert (first.fault, second.fault) == ("goaway", None)
    assert (first.connection, second.connection) == (1, 2)  # the first one was closed


def test_h2_goaway_on_a_later_stream_escapes_httpx(
    h2_upstream: H2Upstream, h2_client: httpx2.Client
) -> None:
    """Documents httpcore 1.0.9: a GOAWAY whose last stream id is below a stream already
    answering raises ``httpcore2.ConnectionNotAvailable`` (not an httpx exception) out of
    the body, once the connection has served an earlier stream (a last stream id of 0
    is a RemoteProtocolError instead). A client of httpx must catch it."""
    assert h2_client.get(f"{h2_upstream.base_url}/models").status_code == 200  # stream 1
    url = f"{h2_upstream.base_url}/chat/completions"
    with pytest.raises(httpcore2.ConnectionNotAvailable):
        with h2_client.stream("POST", url, json=chat("chaos:fault=goaway,at=2")) as response:
            deltas(response.iter_lines())
    assert h2_upstream.requests[-1].stream_id == 3


def test_h2_rst_stream_breaks_only_the_stream(
    h2_upstream: H2Upstream, h2_client: httpx2.Client
) -> None:
    model = "chaos:text=10,fault=rst_stream,at=3,times=1"
    broken_at_3_then_spared(h2_upstream, h2_client, model, "StreamReset")
    first, second = h2_upstream.requests
    assert (first.fault, second.fault) == ("rst_stream", None)
    assert (first.connection, first.stream_id) == (1, 1)
    assert (second.connection, second.stream_id) == (1, 3)  # the same connection, still up


def test_http11_chaos_plays_h2_faults_as_reset(chaos: ChaosUpstream) -> None:
    url = f"{chaos.base_url}/chat/completions"
    for fault in ("goaway", "rst_stream"):
        got: list[str] = []
        with httpx2.Client(timeout=TIMEOUT) as client:
            with pytest.raises(httpx2.ReadError):
                with client.stream("POST", url, json=chat(f"chaos:fault={fault},at=2")) as r:
                    deltas(r.iter_lines(), got)
        assert len(got) == 2
