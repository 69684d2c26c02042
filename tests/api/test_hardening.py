"""Findings from review: inputs and upstream behaviours that must not get through."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx2
import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, running_chaos_upstream
from tests.api.streams import stream_chat
from tests.servers import RunningGateway, gateway_config, running_gateway


def raw_get(url: str, target: str) -> bytes:
    """A request whose target goes on the wire exactly as written (httpx would normalize it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return b"".join(iter(lambda: sock.recv(65536), b""))


@pytest.fixture(scope="module")
def victim() -> Iterator[ChaosUpstream]:
    """A host that no request may ever reach: the one a crafted path names."""
    with running_chaos_upstream() as upstream:
        yield upstream


PATH_TRICKS = [
    "/v1%2f@127.0.0.1:{port}/x",
    "/v1%2F%2F127.0.0.1:{port}/x",
    "/v1/%2f@127.0.0.1:{port}/x",
    "/v1/@127.0.0.1:{port}/x",
    "/v1/%40127.0.0.1:{port}/x",
    "/v1//127.0.0.1:{port}/x",
    "/v1/..%2f..%2f@127.0.0.1:{port}/x",
    "/v1/%5c%5c127.0.0.1:{port}/x",
    "/v1/\\127.0.0.1:{port}/x",
    "/v1/../../admin",
    "/v1/models/%2e%2e/x",
    "/v1/a/./b",
    "/v1/%252e%252e/x",
    "/v1/a%0d%0aHost:127.0.0.1:{port}",
]


@pytest.mark.parametrize("with_path", [True, False], ids=["base-with-path", "base-no-path"])
@pytest.mark.parametrize("trick", PATH_TRICKS)
def test_crafted_paths_reach_no_host(
    chaos: ChaosUpstream, victim: ChaosUpstream, trick: str, with_path: bool
) -> None:
    base = chaos.base_url if with_path else chaos.base_url.removesuffix("/v1")
    config = gateway_config(base, upstream={"api_key": "sk-upstream-secret"})
    chaos.requests.clear()
    victim.requests.clear()
    with running_gateway(config) as gateway:
        answer = raw_get(gateway.url, trick.format(port=victim.port))
    status = answer.split(b" ", 2)[1]
    assert status in (b"400", b"404"), answer[:200]
    assert b"Traceback" not in answer and b"sk-upstream-secret" not in answer
    assert victim.requests == []
    assert chaos.requests == []


def test_absolute_form_target_goes_to_the_configured_upstream(
    gateway: RunningGateway, chaos: ChaosUpstream, victim: ChaosUpstream
) -> None:
    victim.requests.clear()
    chaos.requests.clear()
    raw_get(gateway.url, f"http://127.0.0.1:{victim.port}/v1/files")
    assert victim.requests == []
    assert chaos.requests[-1].path == "/v1/files"


def test_an_authority_in_the_query_stays_in_the_query(
    gateway: RunningGateway, chaos: ChaosUpstream, victim: ChaosUpstream
) -> None:
    victim.requests.clear()
    raw_get(gateway.url, f"/v1/files?next=@127.0.0.1:{victim.port}/x")
    assert victim.requests == []
    assert chaos.requests[-1].query == f"next=@127.0.0.1:{victim.port}/x"


@pytest.fixture
def headers_then_silence() -> Iterator[str]:
    """An upstream that answers 200 at once and then only sends keepalive comments."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            while not stop.wait(0.1):
                try:
                    conn.sendall(b"8\r\n: ping\n\n\r\n")
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    thread.join(5)
    listener.close()


def test_first_event_timeout_fires_after_headers(headers_then_silence: str) -> None:
    config = gateway_config(
        headers_then_silence, upstream={"timeouts": {"first_byte": 0.5, "idle": 5}}
    )
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client,
    ):
        started = time.monotonic()
        with pytest.raises(openai.APIError, match="first-byte timeout"):
            stream_chat(client, "m")
    assert time.monotonic() - started < 3  # not the upstream's 5 s idle, nor forever


def test_broken_pass_through_event_stream_ends_with_an_error(gateway: RunningGateway) -> None:
    body = {"model": "chaos:text=20,fault=reset,at=5", "prompt": "x", "stream": True}
    response = httpx2.post(gateway.base_url + "/completions", json=body)
    lines = [line for line in response.text.splitlines() if line]
    assert '"error"' in lines[-1]
    assert "[DONE]" not in response.text


def test_query_reaches_the_upstream(gateway: RunningGateway, chaos: ChaosUpstream) -> None:
    httpx2.get(gateway.base_url + "/files?purpose=batch&limit=2")
    assert (chaos.requests[-1].path, chaos.requests[-1].query) == (
        "/v1/files",
        "purpose=batch&limit=2",
    )


def test_upstream_is_not_offered_compression_the_client_did_not_offer(
    gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    with httpx2.Client() as client:
        del client.headers["accept-encoding"]
        client.post(gateway.base_url + "/embeddings", json={"model": "chaos", "input": "x"})
    assert chaos.requests[-1].headers["accept-encoding"] == "identity"


def test_gateway_key_is_not_forwarded_to_an_upstream_without_a_key(chaos: ChaosUpstream) -> None:
    config = gateway_config(chaos.base_url, auth={"keys": ["gw-secret-key"]})
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="gw-secret-key", max_retries=0) as client,
    ):
        stream_chat(client, "chaos:text=3")
        client.embeddings.create(model="chaos", input="x")
    for request in chaos.requests[-2:]:
        assert "authorization" not in request.headers
