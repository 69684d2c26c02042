"""Circuit breaking end to end: an upstream that keeps failing is skipped, then probed.

Two upstream entries, ``flaky`` and ``steady``, point at the same chaos upstream;
what each leg asks for is in its model name, so the requests the failing leg made
are counted by that name.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.config.load import parse_config
from gateway.config.schema import GatewayConfig
from tests.api.streams import MESSAGES, stream_chat
from tests.servers import RunningGateway, running_gateway

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "retries": 0}
COOLDOWN = 0.5
TIMEOUTS = {"connect": 2, "first_byte": 3, "idle": 0.5}


def two_upstreams(chaos: ChaosUpstream, *legs: str, failures: int = 2) -> GatewayConfig:
    """A route whose legs are (upstream, model) pairs, given as "upstream=model"."""
    circuit = {"failures": failures, "cooldown": COOLDOWN}
    upstreams = [
        {"name": name, "base_url": chaos.base_url, "timeouts": TIMEOUTS, "circuit": circuit}
        for name in ("flaky", "steady")
    ]
    pairs = [leg.split("=", 1) for leg in legs]
    route: dict[str, Any] = {
        "match": "*",
        "upstream": pairs[0][0],
        "model": pairs[0][1],
        "retry": FAST_RETRY,
        "fallbacks": [{"upstream": u, "model": m} for u, m in pairs[1:]],
    }
    return parse_config({"upstreams": upstreams, "routes": [route]}, "test config")


def sample(gateway: RunningGateway, name: str, **labels: str) -> float:
    return gateway.metrics.registry.get_sample_value(name, labels) or 0.0


def complete(client: OpenAI) -> str | None:
    """A non-streaming run: the same protection as a stream."""
    completion = client.chat.completions.create(model="anything", messages=MESSAGES)
    return completion.choices[0].message.content


def test_an_open_circuit_skips_the_upstream_until_one_probe_closes_it(
    chaos: ChaosUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    # 503 to its first three requests: two open the circuit, the first probe fails.
    failing = "chaos:text=6,seed=80,fault=http_503,times=3"
    clean = "chaos:text=6,seed=81"
    config = two_upstreams(chaos, f"flaky={failing}", f"steady={clean}")
    with (
        caplog.at_level(logging.INFO, logger="gateway.circuit"),
        running_gateway(config) as gw,
        OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
    ):

        def tried() -> int:
            return len(chaos.requests_for(failing))

        def state(name: str) -> float:
            return sample(gw, "gateway_circuit_transitions_total", upstream="flaky", state=name)

        assert stream_chat(client, "anything").text == expected_answer(clean).text
        assert tried() == 1 and state("open") == 0
        assert complete(client) == expected_answer(clean).text
        assert tried() == 2 and state("open") == 1  # open: two failures in a row
        assert sample(gw, "gateway_circuit_open", upstream="flaky") == 1

        # While open: straight to the fallback, nothing sent to the failing upstream.
        assert stream_chat(client, "anything").text == expected_answer(clean).text
        assert complete(client) == expected_answer(clean).text
        assert tried() == 2

        time.sleep(COOLDOWN)
        assert stream_chat(client, "anything").text == expected_answer(clean).text
        assert tried() == 3  # the probe, refused: open again for another cool-down
        assert (state("half_open"), state("open")) == (1, 2)
        assert complete(client) == expected_answer(clean).text
        assert tried() == 3

        time.sleep(COOLDOWN)
        assert stream_chat(client, "anything").text == expected_answer(failing).text
        assert tried() == 4 and state("closed") == 1  # the probe answered: closed
        assert sample(gw, "gateway_circuit_open", upstream="flaky") == 0
        assert complete(client) == expected_answer(failing).text
        assert tried() == 5
    lines = [r for r in caplog.records if r.name == "gateway.circuit"]
    assert [(r.getMessage(), vars(r)["upstream"]) for r in lines] == [
        ("circuit open", "flaky"),
        ("circuit open", "flaky"),
        ("circuit closed", "flaky"),
    ]


def test_when_every_circuit_is_open_the_last_leg_is_still_tried(chaos: ChaosUpstream) -> None:
    first = "chaos:text=6,seed=82,fault=http_503"
    last = "chaos:text=6,seed=83,fault=http_503"
    config = two_upstreams(chaos, f"flaky={first}", f"steady={last}", failures=1)
    with (
        running_gateway(config) as gw,
        OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
    ):
        for runs in (1, 2, 3):
            with pytest.raises(openai.InternalServerError):
                stream_chat(client, "anything")
            assert len(chaos.requests_for(first)) == 1  # skipped once open
            assert len(chaos.requests_for(last)) == runs  # never a failure without a try
        assert sample(gw, "gateway_circuit_open", upstream="steady") == 1


def test_streams_that_break_mid_way_open_the_circuit(chaos: ChaosUpstream) -> None:
    broken = "chaos:text=20,seed=84,fault=reset,at=5"
    clean = "chaos:text=20,seed=84"  # the same answer: the fallback finishes it
    config = two_upstreams(chaos, f"flaky={broken}", f"steady={clean}")
    with (
        running_gateway(config) as gw,
        OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
    ):
        for _ in range(3):
            assert stream_chat(client, "anything").text == expected_answer(clean).text
        assert len(chaos.requests_for(broken)) == 2
        assert sample(gw, "gateway_circuit_open", upstream="flaky") == 1
        assert sample(gw, "gateway_circuit_open", upstream="steady") == 0
