"""The header policy, both ways (pure: no sockets)."""

from __future__ import annotations

from typing import Any

from gateway.config.load import parse_config
from gateway.config.schema import Upstream
from gateway.upstream.client import UpstreamClient
from gateway.upstream.headers import answer_metadata, forwarded_request_headers

CLIENT = [
    ("OpenAI-Organization", "org-1"),
    ("openai-project", "proj-1"),
    ("OpenAI-Beta", "assistants=v2"),
    ("user-agent", "OpenAI/Python 1.0"),
    ("x-stainless-os", "Linux"),
    ("content-type", "application/json"),
    ("host", "gateway.example"),
    ("content-length", "42"),
    ("transfer-encoding", "chunked"),
    ("connection", "keep-alive, X-Private-Hop"),
    ("x-private-hop", "1"),
    ("keep-alive", "timeout=5"),
    ("te", "trailers"),
    ("proxy-authorization", "Basic eA=="),
    ("expect", "100-continue"),
    ("cookie", "session=1"),
    ("authorization", "Bearer sk-client"),
    ("x-api-key", "sk-client-2"),
    ("api-key", "sk-client-3"),
    ("x-run-id", "0123"),
    ("x-resume-from", "4"),
]


def test_end_to_end_client_headers_are_forwarded_with_lower_case_names() -> None:
    assert forwarded_request_headers(CLIENT, credentials=False) == {
        "openai-organization": "org-1",
        "openai-project": "proj-1",
        "openai-beta": "assistants=v2",
        "user-agent": "OpenAI/Python 1.0",
        "x-stainless-os": "Linux",
        "content-type": "application/json",
    }


def test_credentials_other_than_authorization_only_when_allowed() -> None:
    forwarded = forwarded_request_headers(CLIENT, credentials=True)
    assert (forwarded["x-api-key"], forwarded["api-key"]) == ("sk-client-2", "sk-client-3")
    assert "authorization" not in forwarded  # its own path: UpstreamClient.request_headers


def test_only_request_metadata_comes_back_on_a_chat_completion() -> None:
    upstream = [
        ("Content-Type", "text/event-stream"),
        ("X-Request-Id", "req-1"),
        ("openai-processing-ms", "12"),
        ("OpenAI-Organization", "org-up"),
        ("openai-version", "2020-10-01"),
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-reset-tokens", "6ms"),
        ("set-cookie", "__cf_bm=1"),
        ("cf-ray", "abc"),
        ("transfer-encoding", "chunked"),
    ]
    assert answer_metadata(upstream) == {
        "x-request-id": "req-1",
        "openai-processing-ms": "12",
        "openai-organization": "org-up",
        "openai-version": "2020-10-01",
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-reset-tokens": "6ms",
    }


ANTHROPIC_CLIENT = [
    ("x-api-key", "sk-ant-client"),
    ("anthropic-version", "2023-06-01"),
    ("anthropic-beta", "interleaved-thinking-2025-05-14"),
    ("user-agent", "Anthropic/Python 0.60"),
]


def _anthropic_client(**upstream: Any) -> tuple[UpstreamClient, Upstream]:
    config = parse_config(
        {"upstreams": [{"name": "claude", "kind": "anthropic", "base_url": "http://x"} | upstream]}
    )
    return UpstreamClient(config.upstreams, config.limits), config.upstreams[0]


def test_an_anthropic_upstream_key_goes_as_x_api_key_and_the_clients_stays_home() -> None:
    client, upstream = _anthropic_client(api_key="sk-ant-gateway-key")
    forwarded = forwarded_request_headers(ANTHROPIC_CLIENT, credentials=True)
    headers = client.request_headers(upstream, forwarded, None)
    assert headers["x-api-key"] == "sk-ant-gateway-key"
    assert "authorization" not in headers
    # anthropic-* headers pass through: the client's version and betas are its own.
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


def test_without_a_key_of_its_own_the_clients_x_api_key_goes_and_a_version_is_added() -> None:
    client, upstream = _anthropic_client(anthropic_version="2099-01-01")
    forwarded = forwarded_request_headers([("x-api-key", "sk-ant-client")], credentials=True)
    headers = client.request_headers(upstream, forwarded, None)
    assert headers["x-api-key"] == "sk-ant-client"
    assert headers["anthropic-version"] == "2099-01-01"  # the client sent none


def test_anthropic_request_metadata_comes_back() -> None:
    upstream = [
        ("request-id", "req_01"),
        ("anthropic-ratelimit-requests-remaining", "49"),
        ("content-type", "text/event-stream"),
    ]
    assert answer_metadata(upstream) == {
        "request-id": "req_01",
        "anthropic-ratelimit-requests-remaining": "49",
    }
