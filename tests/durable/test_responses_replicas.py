"""A Responses stream resumed on another replica after its owner was SIGKILLed.

The client re-attaches the way OpenAI documents it, ``client.responses.retrieve(id,
stream=True, starting_after=N)``, with the id it saw in ``response.created``: the
other replica finds the run through Redis, takes it over from the checkpoint and
continues the upstream. The events before and after must read as one stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.durable.two_replicas import CREDENTIAL, check_retrieved, sdk, start_response, state
from tests.processes import Replica, Replicas, replica_config, wait_until
from tests.redis_server import RedisServer


def test_retrieve_on_another_replica_after_the_owner_is_killed_takes_the_run_over(
    replicas: Replicas, chaos: ChaosUpstream, redis_server: RedisServer
) -> None:
    model = "chaos:text=80,seed=41,pace_ms=25"
    b, _ = killed_and_retrieved(replicas, redis_server, model, 10)
    original, continuation = chaos.requests_for(model)
    assistant = [item for item in continuation.body["input"] if item.get("role") == "assistant"]
    assert len(assistant) == 1 and expected_answer(model).text.startswith(assistant[0]["content"])


def test_another_credential_gets_a_404_on_another_replica(
    replicas: Replicas, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=10,seed=42"
    a, b = replicas.start("A", "B")
    with OpenAI(base_url=a.base_url, api_key=CREDENTIAL, max_retries=0) as client:
        events: list[Any] = list(client.responses.create(model=model, input="x", stream=True))
    response_id = events[0].response.id
    with OpenAI(base_url=b.base_url, api_key="sk-other", max_retries=0) as client:
        with pytest.raises(Exception) as raised:
            list(client.responses.retrieve(response_id, stream=True, starting_after=3))
    assert getattr(raised.value, "status_code", None) == 404


@pytest.fixture
def background_replicas(
    chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Replicas]:
    """Replicas whose Responses legs are background responses (``background: true``)."""
    path = replica_config(
        tmp_path / "gateway.yaml", chaos.base_url, redis_server.url, background=True
    )
    chaos.requests.clear()
    with Replicas(path, tmp_path) as running:
        yield running


@pytest.mark.parametrize("tools", [0, 1], ids=["text", "a-function-call"])
def test_a_killed_replicas_background_response_is_read_again_by_the_next(
    background_replicas: Replicas, chaos: ChaosUpstream, redis_server: RedisServer, tools: int
) -> None:
    """The takeover reads the upstream's response again from its start (no new
    generation), checks that it renders what the client has, and sends only the rest:
    one generation, the unbroken answer."""
    model = f"chaos:text=80,reasoning=3,tools={tools},seed=43,pace_ms=25"
    b, response_id = killed_and_retrieved(background_replicas, redis_server, model, 12)
    assert [r.method for r in chaos.requests_for(model) if r.method == "POST"] == ["POST"]
    assert chaos.backgrounds.status(response_id) == "completed"
    plans = {s.labels["plan"]: s.value for s in b.samples("gateway_recoveries_total")}
    assert plans == {"reattach": 1.0}


def killed_and_retrieved(
    replicas: Replicas, redis_server: RedisServer, model: str, events: int
) -> tuple[Replica, str]:
    """A stream started on A, read for ``events`` events; A checkpoints ahead of the
    client and dies without a word (SIGKILL), and the client retrieves the rest from B
    as OpenAI documents, ``starting_after`` its last event: one stream, B's takeover.
    Returns B and the response's id."""
    a, b = replicas.start("A", "B")
    first: list[Any] = []
    store = redis.Redis.from_url(redis_server.url)
    try:
        with sdk(a) as client:
            run_id, stream = start_response(client, model)
            for event in stream:
                first.append(event)
                if len(first) == events:
                    break
            wait_until(lambda: state(store, run_id)["seq"] >= len(first) + 6, "A checkpoints")
            a.freeze()
            a.kill()
            stream.close()
    finally:
        store.close()
    check_retrieved(b, first, model)
    assert b.resumed("takeover") == 1
    return b, first[0].response.id
