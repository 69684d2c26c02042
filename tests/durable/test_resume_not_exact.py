"""A resume position the gateway cannot place is an explicit error, never a guess.

A client that says it holds more events than the run's log (what a dead replica
released and the store never got, or simply a wrong number) gets
``409 resume_not_exact`` with ``x-should-retry: false`` on every door
(``x-resume-from``, ``Last-Event-ID``, ``starting_after``) and protocol, and the
SDK raises; nothing is sent upstream, and the run stays resumable by a client the
log can place. One gateway with its in-memory store, real sockets, the official
SDKs as clients. The same rule across replicas and Redis failovers:
``test_correlated_failures.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx2
import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import MESSAGES, Received, receive
from tests.api.streams import start as start_open
from tests.durable.test_resume import resume, sample, start
from tests.servers import RunningGateway, gateway_config, running_gateway, wait_for

PACED = "chaos:text=60,seed={seed},pace_ms=40"
FAR = 5000  # more events than any of these answers has


def not_exact(response: httpx2.Response) -> None:
    assert response.status_code == 409, response.text
    assert response.headers["x-should-retry"] == "false"
    error = response.json()["error"]
    assert error["code"] == "resume_not_exact"
    assert "cannot be resumed exactly" in error["message"]


def refused(gateway: RunningGateway, kind: str) -> float:
    return sample(gateway, "gateway_resumes_total", kind=kind, outcome="not_exact")


@pytest.fixture
def gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    config = gateway_config(chaos.base_url, state={"detach_grace": 0.1, "completed_ttl": 30})
    with running_gateway(config) as running:
        yield running


@pytest.fixture
def sdk(gateway: RunningGateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=2) as client:
        yield client


@pytest.mark.parametrize(
    ("where", "kind"), [("live", "local"), ("detached", "takeover"), ("finished", "replay")]
)
def test_a_chat_client_ahead_of_the_log_is_refused_by_every_door(
    gateway: RunningGateway, sdk: OpenAI, chaos: ChaosUpstream, where: str, kind: str
) -> None:
    model = PACED.format(seed=80)
    chaos.requests.clear()
    received = Received()
    if where == "live":  # its first connection stays open: the run relays meanwhile
        run_id, live = start_open(sdk, model, received, 6)
    else:
        run_id = start(sdk, model, 6, received)
    if where == "detached":
        wait_for(lambda: sample(gateway, "gateway_detached_runs_cancelled_total") == 1)
    elif where == "finished":
        resume(sdk, model, run_id, received)  # read to the end: the run finishes
        assert received.text == expected_answer(model).text
    requests = len(chaos.requests)
    # The SDK door: the error is raised, once (x-should-retry: false beats max_retries=2).
    headers = {"x-run-id": run_id, "x-resume-from": str(FAR)}
    with pytest.raises(openai.ConflictError) as raised:
        sdk.chat.completions.create(
            model=model, messages=MESSAGES, stream=True, extra_headers=headers
        )
    assert raised.value.code == "resume_not_exact"
    # The EventSource door.
    not_exact(
        httpx2.get(
            f"{gateway.base_url}/runs/{run_id}/events",
            headers={"authorization": "Bearer k", "last-event-id": str(FAR)},
        )
    )
    assert refused(gateway, kind) == 2
    assert len(chaos.requests) == requests, "nothing goes upstream for a refused resume"
    if where == "live":
        receive(live, received)
    elif where == "detached":
        # The run is still there for a client the log can place.
        resume(sdk, model, run_id, received)
        assert received.text == expected_answer(model).text
        assert received.finish_reasons == ["stop"]


def test_a_responses_client_ahead_of_the_log_is_refused_by_starting_after(
    gateway: RunningGateway, sdk: OpenAI
) -> None:
    model = PACED.format(seed=82)
    with sdk.responses.create(model=model, input="x", stream=True) as stream:
        first = [event for event, _ in zip(stream, range(8), strict=False)]
    created = first[0]
    assert created.type == "response.created"
    response_id = created.response.id
    wait_for(lambda: sample(gateway, "gateway_detached_runs_cancelled_total") == 1)
    with pytest.raises(openai.ConflictError) as raised:
        sdk.responses.retrieve(response_id, stream=True, starting_after=FAR)
    assert raised.value.code == "resume_not_exact"
    assert refused(gateway, "takeover") == 1
    rest = list(sdk.responses.retrieve(response_id, stream=True, starting_after=7))
    assert rest[-1].type == "response.completed"


def test_a_messages_client_ahead_of_the_log_is_refused(chaos: ChaosUpstream) -> None:
    root = chaos.base_url.removesuffix("/v1")
    config = gateway_config(root, upstream={"kind": "anthropic"}, state={"detach_grace": 0.1})
    model = PACED.format(seed=83)
    ask = {"model": model, "max_tokens": 1024, "messages": MESSAGES}
    with (
        running_gateway(config) as gateway,
        anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=2) as client,
    ):
        raw = client.messages.with_raw_response.create(**ask, stream=True)  # type: ignore[call-overload]
        run_id = raw.headers["x-run-id"]
        with raw.parse() as stream:
            first = [event for event, _ in zip(stream, range(5), strict=False)]
        wait_for(lambda: sample(gateway, "gateway_detached_runs_cancelled_total") == 1)
        headers = {"x-run-id": run_id, "x-resume-from": str(FAR)}
        with pytest.raises(anthropic.ConflictError) as raised:
            client.messages.create(**ask, stream=True, extra_headers=headers)  # type: ignore[call-overload]
        assert raised.value.body["error"]["code"] == "resume_not_exact"  # type: ignore[index]
        assert refused(gateway, "takeover") == 1
        headers["x-resume-from"] = str(len(first))
        with client.messages.create(**ask, stream=True, extra_headers=headers) as rest:  # type: ignore[call-overload]
            assert [event.type for event in rest][-1] == "message_stop"
