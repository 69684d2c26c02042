"""The header policy, both ways (pure: no sockets)."""

from __future__ import annotations

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
