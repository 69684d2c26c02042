"""Timeouts per route: a route's `timeouts` replace its upstreams' for its requests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from gateway.chaos import expected_answer, running_chaos_upstream
from tests.api.streams import stream_chat
from tests.servers import gateway_config, running_gateway

STALLS = "chaos:text=20,seed=91,fault=stall,at=5,times=1,stall_s=30"
STALLS_TOO = STALLS.replace("seed=91", "seed=92")
SLOW_HEADERS = "chaos:text=5,seed=93,first_byte_ms=1500"
# A reasoning model (reasoning deltas first, then text) that stalls once its text flows,
# and one that stalls while it is still reasoning.
STALLS_ANSWERING = "chaos:text=20,reasoning=4,seed=94,fault=stall,at=10,times=1,stall_s=30"
STALLS_THINKING = "chaos:text=20,reasoning=4,seed=95,fault=stall,at=2,times=1,stall_s=30"


@pytest.fixture(scope="module")
def client() -> Iterator[OpenAI]:
    """One upstream (idle 2 s, first byte 5 s) behind routes that set shorter timeouts."""
    routes = [
        {"match": "short-idle", "upstream": "chaos", "model": STALLS, "timeouts": {"idle": 0.3}},
        {"match": "upstream-idle", "upstream": "chaos", "model": STALLS_TOO},
        {
            "match": "short-first-byte",
            "upstream": "chaos",
            "model": SLOW_HEADERS,
            "timeouts": {"first_byte": 0.3},
        },
        {"match": "upstream-first-byte", "upstream": "chaos", "model": SLOW_HEADERS},
        {
            "match": "answering",
            "upstream": "chaos",
            "model": STALLS_ANSWERING,
            "timeouts": {"idle": 1.0},
        },
        {
            "match": "thinking",
            "upstream": "chaos",
            "model": STALLS_THINKING,
            "timeouts": {"idle": 1.0},
        },
    ]
    with (
        running_chaos_upstream() as chaos,
        running_gateway(gateway_config(chaos.base_url, routes=routes)) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as openai_client,
    ):
        yield openai_client


def test_a_route_with_a_short_idle_timeout_recovers_a_stall_fast(client: OpenAI) -> None:
    started = time.monotonic()
    assert stream_chat(client, "short-idle").text == expected_answer(STALLS).text
    assert time.monotonic() - started < 1.5  # its 0.3 s, not the upstream's 2 s


def test_a_route_without_timeouts_waits_the_upstreams_idle_timeout(client: OpenAI) -> None:
    started = time.monotonic()
    assert stream_chat(client, "upstream-idle").text == expected_answer(STALLS_TOO).text
    assert time.monotonic() - started >= 2.0


def test_a_route_with_a_short_first_byte_timeout_gives_up_first(client: OpenAI) -> None:
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError, match=r"within 0\.3s") as raised:
        stream_chat(client, "short-first-byte")
    assert raised.value.status_code == 504
    assert time.monotonic() - started < 1.2  # before the upstream's first byte at 1.5 s
    # The same upstream on a route that keeps its 5 s first-byte timeout answers.
    assert stream_chat(client, "upstream-first-byte").text == expected_answer(SLOW_HEADERS).text


def reason(client: OpenAI, model: str) -> str:
    """A reasoning request, as Codex sends every one (``reasoning: {summary: auto}``)."""
    with client.responses.stream(
        model=model, input="x", reasoning={"effort": "high", "summary": "auto"}
    ) as events:
        for _ in events:
            pass
        return events.get_final_response().output_text


def test_a_reasoning_request_waits_the_normal_idle_once_its_answer_flows(client: OpenAI) -> None:
    started = time.monotonic()
    assert reason(client, "answering") == expected_answer(STALLS_ANSWERING).text
    assert time.monotonic() - started < 1.8  # the route's 1 s: the text was flowing


def test_a_reasoning_request_waits_twice_the_idle_while_the_model_may_think(
    client: OpenAI,
) -> None:
    started = time.monotonic()
    assert reason(client, "thinking") == expected_answer(STALLS_THINKING).text
    assert time.monotonic() - started >= 2.0  # silent thinking: twice the route's 1 s
