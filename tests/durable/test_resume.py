"""Resuming streams on one gateway (the embedded in-memory store): live, finished,
detached past its grace, refused. Real sockets, the openai SDK as the client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import MESSAGES, Received, receive
from tests.servers import RunningGateway, gateway_config, running_gateway, wait_for

PACED = "chaos:text=60,seed={seed},pace_ms=15"


def start(client: OpenAI, model: str, chunks: int, into: Received) -> str:
    """Start a stream, read ``chunks`` chunks into ``into``, drop the connection; the run id."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, stream=True
    )
    run_id = raw.headers["x-run-id"]
    stream = raw.parse()
    for chunk in stream:
        into.feed(chunk)
        if into.chunks == chunks:
            break
    stream.close()
    return run_id


def resume(client: OpenAI, model: str, run_id: str, into: Received) -> Received:
    headers = {"x-run-id": run_id, "x-resume-from": str(into.chunks)}
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, extra_headers=headers
    )
    return receive(stream, into)


def sample(gateway: RunningGateway, name: str, **labels: str) -> float:
    return gateway.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def sdk(gateway: RunningGateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway.base_url, api_key="sk-owner", max_retries=0) as client:
        yield client


def test_sdk_client_resumes_a_live_run_with_exactly_what_it_missed(
    gateway: RunningGateway, sdk: OpenAI
) -> None:
    model = PACED.format(seed=1)
    received = Received()
    run_id = start(sdk, model, 10, received)
    assert len(received.text) > 0
    resume(sdk, model, run_id, received)
    answer = expected_answer(model)
    assert received.text == answer.text  # nothing lost, nothing repeated
    assert received.roles == ["assistant"]
    assert received.finish_reasons == [answer.finish_reason]
    assert len(received.ids) == 1  # one identity across both connections
    assert sample(gateway, "gateway_resumes_total", kind="local", outcome="ok") == 1


def events_of(response: httpx2.Response) -> list[tuple[int, Any]]:
    """(id, payload) of each event; fails on a comment line (no keepalive after ids)."""
    out: list[tuple[int, Any]] = []
    current = 0
    for line in response.iter_lines():
        assert not line.startswith(":"), "a comment after id: lines breaks SDK decoders"
        if line.startswith("id: "):
            current = int(line[4:])
        elif line.startswith("data: "):
            data = line[6:]
            out.append((current, data if data == "[DONE]" else orjson.loads(data)))
    return out


def text_of(events: list[tuple[int, Any]]) -> str:
    return "".join(
        (c["choices"][0]["delta"].get("content") or "") if c != "[DONE]" and c["choices"] else ""
        for _, c in events
    )


def test_event_source_resumes_from_last_event_id_and_204s_when_complete(
    gateway: RunningGateway,
) -> None:
    model = PACED.format(seed=2)
    body = {"model": model, "messages": MESSAGES, "stream": True}
    auth = {"authorization": "Bearer sk-owner"}
    first: list[str] = []
    with httpx2.stream(
        "POST", gateway.base_url + "/chat/completions", json=body, headers=auth
    ) as r:
        run_id = r.headers["x-run-id"]
        for line in r.iter_lines():
            if line.startswith("data: "):
                first.append(line[6:])
            if len(first) == 7:
                break
        assert not any(line.startswith("id:") for line in first)  # not asked for: no ids
    url = f"{gateway.base_url}/runs/{run_id}/events"
    with httpx2.stream("GET", url, headers=auth | {"last-event-id": "7"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        rest = events_of(r)
    assert [n for n, _ in rest] == list(range(8, 8 + len(rest)))
    assert rest[-1][1] == "[DONE]"
    text = "".join(orjson.loads(d)["choices"][0]["delta"].get("content") or "" for d in first)
    assert text + text_of(rest) == expected_answer(model).text
    # Reconnecting after the end (an EventSource does): 204 tells it to stop.
    done = httpx2.get(url, headers=auth | {"last-event-id": str(rest[-1][0])})
    assert done.status_code == 204
    # ?after= works the same, for a first connection that cannot set headers.
    again = httpx2.get(url + "?after=60", headers=auth)
    assert [n for n, _ in events_of(again)][0] == 61


def test_a_finished_run_replays_its_tail_to_a_late_resumer(
    gateway: RunningGateway, sdk: OpenAI
) -> None:
    model = "chaos:text=12,seed=3"
    received = Received()
    run_id = start(sdk, model, 5, received)
    time.sleep(0.2)  # the run completes meanwhile, detached
    resume(sdk, model, run_id, received)
    assert received.text == expected_answer(model).text
    assert received.finish_reasons == ["stop"]


def test_resume_with_another_credential_or_an_unknown_id_is_a_404(
    gateway: RunningGateway, sdk: OpenAI
) -> None:
    model = PACED.format(seed=4)
    received = Received()
    run_id = start(sdk, model, 3, received)
    cases = [
        (run_id, {"authorization": "Bearer sk-someone-else"}),
        (run_id, {}),  # no credential at all
        ("0" * 32, {"authorization": "Bearer sk-owner"}),
    ]
    for rid, auth in cases:
        post = httpx2.post(
            gateway.base_url + "/chat/completions",
            json={"model": model, "messages": MESSAGES, "stream": True},
            headers=auth | {"x-run-id": rid, "x-resume-from": "3"},
        )
        get = httpx2.get(f"{gateway.base_url}/runs/{rid}/events", headers=auth)
        for response in (post, get):
            assert response.status_code == 404
            error = response.json()["error"]
            assert error["code"] == "run_not_found"
            assert "sk-" not in error["message"]
    # The owner still can.
    assert resume(sdk, model, run_id, received).text == expected_answer(model).text


def test_a_client_that_holds_nothing_of_a_run_gone_gets_a_fresh_answer(
    gateway: RunningGateway, sdk: OpenAI
) -> None:
    """The same call again with ``x-resume-from: 0`` (it got nothing before the
    connection dropped) for a run the gateway does not hold for it: a new run of the
    request, as exact as the rest of the old one would be, not a 404."""
    model = "chaos:text=12,seed=6"
    raw = sdk.chat.completions.with_raw_response.create(
        model=model,
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-run-id": "0" * 32, "x-resume-from": "0"},
    )
    run_id = raw.headers["x-run-id"]
    received = Received()
    with raw.parse() as stream:
        for chunk in stream:
            received.feed(chunk)
    assert run_id != "0" * 32
    assert received.text == expected_answer(model).text and received.finish_reasons == ["stop"]
    # A client that holds some of it cannot start again: that is still a 404.
    held = httpx2.post(
        gateway.base_url + "/chat/completions",
        json={"model": model, "messages": MESSAGES, "stream": True},
        headers={"authorization": "Bearer k", "x-run-id": "0" * 32, "x-resume-from": "2"},
    )
    assert held.status_code == 404


def test_an_expired_run_is_a_404(chaos: ChaosUpstream) -> None:
    config = gateway_config(chaos.base_url, state={"completed_ttl": 0.3})
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as sdk,
    ):
        received = Received()
        run_id = start(sdk, "chaos:text=5,seed=5", 2, received)
        time.sleep(0.8)
        response = httpx2.get(
            f"{gateway.base_url}/runs/{run_id}/events", headers={"authorization": "Bearer k"}
        )
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "run_not_found"


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "9" * 40])
def test_a_bad_resume_offset_is_a_clear_400(gateway: RunningGateway, value: str) -> None:
    response = httpx2.post(
        gateway.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES},
        headers={"x-run-id": "abc", "x-resume-from": value},
    )
    assert response.status_code == 400
    assert "x-resume-from" in response.json()["error"]["message"]


def test_a_run_stopped_after_its_grace_is_continued_from_its_checkpoint(
    chaos: ChaosUpstream,
) -> None:
    config = gateway_config(chaos.base_url, state={"detach_grace": 0.1})
    model = PACED.format(seed=6)
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as sdk,
    ):
        chaos.requests.clear()
        received = Received()
        run_id = start(sdk, model, 8, received)
        had = received.text
        wait_for(lambda: sample(gateway, "gateway_detached_runs_cancelled_total") == 1)
        resume(sdk, model, run_id, received)
        assert received.text == expected_answer(model).text
        assert received.finish_reasons == ["stop"]
        assert sample(gateway, "gateway_resumes_total", kind="takeover", outcome="ok") == 1
    first, continuation = chaos.requests
    assistant = continuation.body["messages"][-2]
    assert assistant["role"] == "assistant"
    # Continued from the checkpoint: at least what the client had when it left.
    assert assistant["content"].startswith(had)
    assert expected_answer(model).text.startswith(assistant["content"])


def test_a_stopped_run_with_complete_tool_calls_ends_without_an_upstream_call(
    chaos: ChaosUpstream,
) -> None:
    config = gateway_config(chaos.base_url, state={"detach_grace": 0.05})
    model = "chaos:text=0,tools=3,arg_deltas=6,seed=7,pace_ms=25"
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as sdk,
    ):
        chaos.requests.clear()
        raw = sdk.chat.completions.with_raw_response.create(
            model=model, messages=MESSAGES, stream=True
        )
        run_id, stream, received = raw.headers["x-run-id"], raw.parse(), Received()
        for chunk in stream:
            received.feed(chunk)
            if received.tool_calls:
                break
        stream.close()
        wait_for(lambda: sample(gateway, "gateway_detached_runs_cancelled_total") == 1)
        resume(sdk, model, run_id, received)
    assert len(chaos.requests) == 1  # finished from the checkpoint alone
    assert received.finish_reasons == ["tool_calls"]
    expected = [(c.id, c.name, c.arguments) for c in expected_answer(model).tool_calls]
    calls = received.calls()
    assert 1 <= len(calls) < len(expected)
    assert calls == expected[: len(calls)]


def test_without_a_store_live_runs_still_resume_and_stopped_ones_are_gone(
    chaos: ChaosUpstream,
) -> None:
    config = gateway_config(chaos.base_url, state={"store": "off", "detach_grace": 0.3})
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as sdk,
    ):
        model = PACED.format(seed=8)
        received = Received()
        run_id = start(sdk, model, 6, received)
        assert resume(sdk, model, run_id, received).text == expected_answer(model).text
        stopped = start(sdk, PACED.format(seed=9), 3, Received())
        wait_for(lambda: sample(gateway, "gateway_detached_runs_cancelled_total") == 1)
        response = httpx2.get(
            f"{gateway.base_url}/runs/{stopped}/events", headers={"authorization": "Bearer k"}
        )
        assert response.status_code == 404
