"""An upstream that echoes its key never hands it to a client (ARCHITECTURE 6a)."""

from __future__ import annotations

from collections.abc import Iterable

import httpx2
import openai
import orjson
import pytest
from openai import OpenAI

from tests.api.streams import MESSAGES, Received, receive
from tests.raw_upstream import RawRequest, chat_chunk, running_raw_upstream, sse_head
from tests.servers import gateway_config, running_gateway

KEY = "sk-upstream-secret-0123456789"


def echoes_its_key(index: int, request: RawRequest) -> Iterable[bytes]:
    """401 for anything but a stream that asks for "midstream", which breaks in-band."""
    presented = request.headers.get("authorization", "")
    if b"midstream" in request.body:
        yield sse_head() + chat_chunk("", role="assistant") + chat_chunk("Hello")
        error = {"error": {"message": f"internal: bad auth {presented}", "code": 400}}
        yield b"data: " + orjson.dumps(error) + b"\n\n"
        return
    body = orjson.dumps({"error": {"message": f"Incorrect API key provided: {presented}"}})
    yield (
        b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
        b"x-echo: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (presented.encode(), len(body), body)
    )


@pytest.fixture
def gateway_url() -> Iterable[str]:
    with running_raw_upstream(echoes_its_key) as upstream:
        config = gateway_config(
            upstream.base_url, upstream={"api_key": KEY}, auth={"keys": ["gw-key"]}
        )
        with running_gateway(config) as gateway:
            yield gateway.base_url


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/chat/completions", {"model": "m", "messages": [], "stream": True}),
        ("POST", "/chat/completions", {"model": "m", "messages": []}),
        ("POST", "/embeddings", {"model": "m", "input": "x"}),
        ("GET", "/files", None),
        ("GET", "/models", None),
    ],
)
def test_an_upstream_error_that_echoes_the_key_is_scrubbed(
    gateway_url: str, method: str, path: str, body: object
) -> None:
    response = httpx2.request(
        method, gateway_url + path, json=body, headers={"authorization": "Bearer gw-key"}
    )
    assert response.status_code == 401
    assert KEY not in response.text and KEY not in str(response.headers)
    assert "[redacted]" in response.json()["error"]["message"]


def test_an_in_band_error_that_echoes_the_key_is_scrubbed(gateway_url: str) -> None:
    received = Received()
    with OpenAI(base_url=gateway_url, api_key="gw-key", max_retries=0) as client:
        with pytest.raises(openai.APIError) as raised:
            receive(
                client.chat.completions.create(model="midstream", messages=MESSAGES, stream=True),
                received,
            )
    assert received.text == "Hello"
    assert KEY not in raised.value.message and "[redacted]" in raised.value.message
