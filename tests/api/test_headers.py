"""Which headers cross the gateway: one rule for chat completions and pass-through."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream
from tests.api.streams import MESSAGES, receive
from tests.raw_upstream import RawRequest, chat_answer, chat_chunk, running_raw_upstream, sse_head
from tests.servers import gateway_config, running_gateway

CLIENT_HEADERS = {
    "OpenAI-Organization": "org-client",
    "OpenAI-Project": "proj-client",
    "OpenAI-Beta": "assistants=v2",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "Accept-Encoding": "br",  # relayed by pass-through; a chat completion sets its own
    # Never forwarded:
    "Cookie": "session=gateway-origin",
    "x-resume-from": "3",
    "Connection": "keep-alive, x-hop",
    "x-hop": "named by Connection",
    "x-api-key": "client-credential",
}


def _send_every_kind(client: OpenAI) -> None:
    """A streamed chat completion, a non-streamed one, and a pass-through request."""
    receive(
        client.chat.completions.create(
            model="chaos:text=3", messages=MESSAGES, stream=True, extra_headers=CLIENT_HEADERS
        )
    )
    client.chat.completions.create(
        model="chaos:text=3", messages=MESSAGES, extra_headers=CLIENT_HEADERS
    )
    client.embeddings.create(model="chaos", input="x", extra_headers=CLIENT_HEADERS)


def test_client_headers_reach_the_upstream_on_chat_and_pass_through_alike(
    chaos: ChaosUpstream,
) -> None:
    config = gateway_config(chaos.base_url, upstream={"api_key": "sk-upstream-own"})
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="sk-client", max_retries=0) as client,
    ):
        chaos.requests.clear()
        _send_every_kind(client)
    assert [r.path for r in chaos.requests] == [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
    ]
    for request in chaos.requests:
        headers = request.headers
        chat = request.path == "/v1/chat/completions"
        assert headers["accept-encoding"] == ("identity" if chat else "br")
        assert headers["openai-organization"] == "org-client"
        assert headers["openai-project"] == "proj-client"
        assert headers["openai-beta"] == "assistants=v2"
        assert headers["traceparent"] == CLIENT_HEADERS["traceparent"]
        # The upstream's own key, never the client's credentials.
        assert headers["authorization"] == "Bearer sk-upstream-own"
        assert "x-api-key" not in headers
        for name in ("cookie", "x-resume-from", "x-hop"):
            assert name not in headers, name
        assert headers["host"] == f"127.0.0.1:{chaos.port}"
        assert int(headers["content-length"]) > 0


def test_client_credentials_pass_only_without_gateway_keys_or_an_upstream_key(
    chaos: ChaosUpstream,
) -> None:
    with (
        running_gateway(gateway_config(chaos.base_url)) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="sk-client", max_retries=0) as client,
    ):
        chaos.requests.clear()
        _send_every_kind(client)
    for request in chaos.requests:
        assert request.headers["authorization"] == "Bearer sk-client"
        assert request.headers["x-api-key"] == "client-credential"

    config = gateway_config(chaos.base_url, auth={"keys": ["gw-key"]})
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="gw-key", max_retries=0) as client,
    ):
        chaos.requests.clear()
        _send_every_kind(client)
    for request in chaos.requests:
        assert "authorization" not in request.headers
        assert "x-api-key" not in request.headers


METADATA = [
    ("openai-processing-ms", "321"),
    ("openai-organization", "org-upstream"),
    ("openai-version", "2020-10-01"),
    ("x-ratelimit-limit-requests", "500"),
    ("x-ratelimit-remaining-tokens", "149000"),
    ("x-ratelimit-reset-requests", "120ms"),
]
NOT_RELAYED = [("set-cookie", "__cf_bm=abc; path=/"), ("x-upstream-internal", "1")]


@pytest.fixture
def upstream_with_metadata() -> Iterator[str]:
    """Answers the first request with content and no finish (a broken stream), the next
    whole; each with its own x-request-id, rate-limit and openai-* headers."""

    def script(index: int, request: RawRequest) -> Iterable[bytes]:
        yield sse_head(("x-request-id", f"req-{index}"), *METADATA, *NOT_RELAYED)
        if index == 0:
            yield chat_chunk("", role="assistant") + chat_chunk("Hello")
        else:
            yield b"".join(chat_answer("Hello", " there"))

    with running_raw_upstream(script) as upstream:
        yield upstream.base_url


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_chat_responses_carry_the_first_upstream_responses_metadata(
    upstream_with_metadata: str, stream: bool
) -> None:
    config = gateway_config(
        upstream_with_metadata,
        routes=[{"match": "*", "upstream": "chaos", "retry": {"backoff_initial": 0}}],
    )
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client,
    ):
        create = client.chat.completions.with_raw_response.create
        if stream:
            streamed = create(model="m", messages=MESSAGES, stream=True)
            headers = streamed.headers
            text = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
        else:
            whole = create(model="m", messages=MESSAGES)
            headers = whole.headers
            text = whole.parse().choices[0].message.content or ""
    assert text.endswith(" there")  # the first response broke: a second leg finished it
    assert headers["x-request-id"] == "req-0"  # the response the answer started with
    for name, value in METADATA:
        assert headers[name] == value
    for name, _ in NOT_RELAYED:
        assert name not in headers
    assert len(headers["x-run-id"]) == 32
    expected = "text/event-stream" if stream else "application/json"
    assert headers["content-type"].startswith(expected)
