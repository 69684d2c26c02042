"""Slow-stream failover end to end: a leg that crawls below the route's minimum
throughput is left for the next leg, which finishes the same answer byte for byte."""

from __future__ import annotations

import time
from typing import Any

from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import stream_chat
from tests.servers import gateway_config, running_gateway

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "idle_retry_delay": 0.01}
# ~6 characters a delta: a crawl at 300 ms a delta is ~20 characters a second.
MINIMUM = {"chars_per_s": 60, "window": 0.4, "grace": 0.4}


def config(chaos: ChaosUpstream, route: dict[str, Any]) -> Any:
    return gateway_config(
        chaos.base_url,
        upstream={"timeouts": {"connect": 2, "first_byte": 3, "idle": 2}},
        routes=[{"match": "*", "upstream": "chaos", "retry": FAST_RETRY} | route],
    )


def test_crawling_leg_is_left_for_the_next_which_finishes_byte_exact(chaos: ChaosUpstream) -> None:
    crawl = "chaos:text=40,seed=70,pace_ms=300"  # 12 s for the whole answer
    fast = "chaos:text=40,seed=70"
    route = {
        "model": crawl,
        "fallbacks": [{"upstream": "chaos", "model": fast}],
        "min_throughput": MINIMUM,
    }
    chaos.requests.clear()
    with (
        running_gateway(config(chaos, route)) as gw,
        OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
    ):
        began = time.monotonic()
        received = stream_chat(client, "anything")
        took = time.monotonic() - began
        slow = gw.metrics.registry.get_sample_value(
            "gateway_interruptions_total", {"upstream": "chaos", "cause": "slow"}
        )
    assert received.text == expected_answer(fast).text
    assert received.finish_reasons == ["stop"] and len(received.ids) == 1
    assert [r.body["model"] for r in chaos.requests] == [crawl, fast]  # no retry of the crawl
    prefix = chaos.requests[1].body["messages"][-2]
    assert prefix["role"] == "assistant" and prefix["content"]  # continued, not restarted
    assert slow == 1
    assert took < 4  # the crawl alone would take 12 s


def test_a_stream_above_the_minimum_stays_on_its_leg(chaos: ChaosUpstream) -> None:
    paced = "chaos:text=40,seed=71,pace_ms=20"  # ~300 characters a second
    route = {
        "model": paced,
        "fallbacks": [{"upstream": "chaos", "model": "chaos:text=40,seed=71"}],
        "min_throughput": MINIMUM,
    }
    chaos.requests.clear()
    with (
        running_gateway(config(chaos, route)) as gw,
        OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
    ):
        received = stream_chat(client, "anything")
    assert received.text == expected_answer(paced).text
    assert [r.body["model"] for r in chaos.requests] == [paced]


def test_the_last_leg_is_never_left_for_being_slow(chaos: ChaosUpstream) -> None:
    crawl = "chaos:text=6,seed=72,pace_ms=150"
    route = {"model": crawl, "min_throughput": MINIMUM | {"grace": 0}}
    chaos.requests.clear()
    with (
        running_gateway(config(chaos, route)) as gw,
        OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
    ):
        received = stream_chat(client, "anything")
    assert received.text == expected_answer(crawl).text
    assert len(chaos.requests) == 1
