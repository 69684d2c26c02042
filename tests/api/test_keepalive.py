"""`: keepalive` comments while a client stream has nothing to send (ARCHITECTURE 2, item 7)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import MESSAGES, stream_chat
from tests.durable.test_resume import events_of, text_of
from tests.servers import RunningGateway, gateway_config, running_gateway

# A reset after 5 deltas, then a backoff of 0.6-1.2 s: several keepalive intervals.
MODEL = "chaos:text=20,seed=61,pace_ms=10,fault=reset,at=5,times=1"
SLOW_RETRY = {"backoff_initial": 1.2, "backoff_max": 1.2}


@pytest.fixture(scope="module")
def slow(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    route = {"match": "*", "upstream": "chaos", "retry": SLOW_RETRY}
    config = gateway_config(chaos.base_url, routes=[route], state={"keepalive_interval": 0.1})
    with running_gateway(config) as running:
        yield running


def test_a_recovery_wait_sends_keepalive_comments_and_the_answer_stays_exact(
    slow: RunningGateway,
) -> None:
    body = {"model": MODEL.replace("seed=61", "seed=62"), "messages": MESSAGES, "stream": True}
    with httpx2.stream("POST", slow.base_url + "/chat/completions", json=body) as response:
        raw = response.read()
    assert raw.count(b": keepalive\n\n") >= 3
    # Only between events, never inside one; the SDK ignores them.
    events = [e for e in raw.split(b"\n\n") if e and not e.startswith(b":")]
    assert events[-1] == b"data: [DONE]"
    with OpenAI(base_url=slow.base_url, api_key="k", max_retries=0) as client:
        assert stream_chat(client, MODEL).text == expected_answer(MODEL).text


def test_a_stream_with_event_ids_never_gets_a_keepalive(slow: RunningGateway) -> None:
    model = MODEL.replace("seed=61", "seed=63")
    body = {"model": model, "messages": MESSAGES, "stream": True}
    with httpx2.stream("POST", slow.base_url + "/chat/completions", json=body) as response:
        run_id = response.headers["x-run-id"]
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first event: the run goes on, detached
    url = f"{slow.base_url}/runs/{run_id}/events?after=1"
    with httpx2.stream("GET", url) as response:
        events = events_of(response)  # fails on any comment line
    assert events[-1][1] == "[DONE]"
    assert text_of(events) == expected_answer(model).text
