"""An upstream line without an end: a broken stream (limits.max_event_bytes), never buffered."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import httpx2
import openai
import pytest
from openai import OpenAI

from tests.api.streams import Received, receive, stream_chat
from tests.raw_upstream import (
    RawRequest,
    RawUpstream,
    Script,
    chat_answer,
    chat_chunk,
    running_raw_upstream,
    sse_head,
)
from tests.servers import RunningGateway, gateway_config, running_gateway

LIMIT = 1024 * 1024
HUGE = 64 * 1024 * 1024  # what the upstream would send of its line, without a line end
PIECE = b"x" * 65536


def huge_line_first(index: int, request: RawRequest) -> Iterable[bytes]:
    """The first answer: some content, then a line that never ends; the next: whole."""
    yield sse_head()
    if index > 0:
        yield b"".join(chat_answer("Hello there, ", "general Kenobi."))
        return
    yield chat_chunk("", role="assistant") + chat_chunk("Hello ") + chat_chunk("there, ")
    yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
    for _ in range(HUGE // len(PIECE)):
        yield PIECE


def always_huge(index: int, request: RawRequest) -> Iterable[bytes]:
    yield from huge_line_first(0, request)


@contextlib.contextmanager
def limited(script: Script, retries: int) -> Iterator[tuple[RawUpstream, RunningGateway, OpenAI]]:
    """``script`` upstream, a gateway with the limit in front of it, a client of that."""
    with running_raw_upstream(script) as upstream:
        retry = {"retries": retries, "backoff_initial": 0}
        config = gateway_config(
            upstream.base_url,
            limits={"max_event_bytes": LIMIT},
            routes=[{"match": "*", "upstream": "chaos", "retry": retry}],
        )
        with (
            running_gateway(config) as gateway,
            OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client,
        ):
            yield upstream, gateway, client


def test_a_line_over_the_limit_is_recovered_like_a_broken_stream() -> None:
    with limited(huge_line_first, retries=2) as (upstream, gateway, client):
        received = stream_chat(client, "m")
        assert received.text.startswith("Hello there, ")
        assert received.text.endswith("general Kenobi.")
        assert received.finish_reasons == ["stop"]
        broken = gateway.metrics.registry.get_sample_value(
            "gateway_interruptions_total", {"upstream": "chaos", "cause": "protocol"}
        )
        assert broken == 1
        # The gateway hung up once the line passed the limit: it did not read it all.
        assert upstream.sent[0] < HUGE // 4
        # …and it is still up, and serves the next request.
        assert httpx2.get(gateway.url + "/healthz").status_code == 200
        assert stream_chat(client, "m").finish_reasons == ["stop"]


def test_a_line_over_the_limit_every_time_ends_with_a_clean_in_band_error() -> None:
    with limited(always_huge, retries=1) as (upstream, gateway, client):
        received = Received()
        with pytest.raises(openai.APIError, match="broke the HTTP stream"):
            receive(
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "Hi"}], stream=True
                ),
                received,
            )
        assert received.text == "Hello there, "  # what it had, and nothing else
        assert received.finish_reasons == []
        assert len(upstream.requests) == 2
        assert all(sent < HUGE // 4 for sent in upstream.sent)
        assert httpx2.get(gateway.url + "/healthz").status_code == 200
