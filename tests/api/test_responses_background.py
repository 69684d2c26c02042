"""The provider's own resume end to end: a stored Responses stream cut between the gateway
and an OpenAI-shaped upstream that keeps background responses (the chaos upstream, which
keeps them as OpenAI documents) is read again from where it broke, one generation, no
continuation; where the upstream cannot, the usual plans. The openai SDK's stream helper
is the client, beside the raw events checked against its types."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer, running_chaos_upstream
from gateway.protocols.responses_splice import frame
from tests.api.test_responses import STREAM_EVENT, config, stream
from tests.protocols.test_responses_splice import Leg
from tests.raw_upstream import RawRequest, running_raw_upstream, sse_head
from tests.servers import RunningGateway, gateway_config, running_gateway, wait_for

BACKGROUND = {"upstream": {"background": True}}
CUTS = ["reset", "close", "stall", "no_finish"]
UNLIKE = frozenset({"created_at", "model"})


@pytest.fixture(scope="module")
def gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(config(chaos, **BACKGROUND)) as running:
        yield running


@pytest.fixture
def sdk(gateway: RunningGateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
        yield client


def posts(chaos: ChaosUpstream, model: str) -> list[Any]:
    """The generations asked of the upstream for ``model`` (creates, not retrieves)."""
    return [r for r in chaos.requests_for(model) if r.method == "POST"]


def retrieves(chaos: ChaosUpstream) -> int:
    """The upstream's responses read again so far (by anyone: they name no model)."""
    return sum(1 for r in list(chaos.requests) if r.method == "GET" and "/responses/" in r.path)


def reattached(gateway: RunningGateway, outcome: str = "recovered") -> float:
    value = gateway.metrics.recoveries.labels("reattach", outcome)._value.get()
    return float(value)


def raw(gateway: RunningGateway, model: str, **extra: Any) -> list[dict[str, Any]]:
    body = {"model": model, "input": "Tell me.", "stream": True} | extra
    content = httpx2.post(gateway.base_url + "/responses", json=body, timeout=20).content
    return [orjson.loads(line[6:]) for line in content.split(b"\n") if line.startswith(b"data: ")]


def comparable(events: list[Any]) -> list[Any]:
    """Events as JSON, without what differs between two generations of one answer: the
    response's id, creation time and model (the spec, with its fault), and the items'
    ids (numbered by response)."""
    data = [e if isinstance(e, dict) else e.model_dump(mode="json", warnings=False) for e in events]
    names: dict[str, str] = {}
    for event in data:
        response, item = event.get("response") or {}, event.get("item") or {}
        for name in (response.get("id"), item.get("id")):
            if isinstance(name, str):
                names.setdefault(name, f"id{len(names)}")

    def same(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: 0 if k in UNLIKE else same(v) for k, v in value.items()}
        if isinstance(value, list):
            return [same(v) for v in value]
        return names.get(value, value) if isinstance(value, str) else value

    return [same(event) for event in data]


@pytest.mark.parametrize("fault", CUTS)
@pytest.mark.parametrize("at", [0, 9, 30], ids=["before-content", "mid-text", "after-last"])
def test_a_cut_stream_is_read_again_and_arrives_as_the_unbroken_one(
    sdk: OpenAI, gateway: RunningGateway, chaos: ChaosUpstream, fault: str, at: int
) -> None:
    spec = "chaos:text=30,reasoning=4,tools=1,seed=47,pace_ms=2"
    unbroken = stream(sdk, spec)
    model = f"{spec},fault={fault},at={at},times=1"
    before, started = reattached(gateway), chaos.backgrounds.started
    streamed = stream(sdk, model)
    assert comparable(streamed.events) == comparable(unbroken.events)
    assert streamed.text() == expected_answer(model).text
    assert streamed.final.usage.output_tokens == unbroken.final.usage.output_tokens
    # One generation: no continuation, no restart; read again instead.
    assert len(posts(chaos, model)) == 1
    assert chaos.backgrounds.started == started + 1
    assert reattached(gateway) == before + 1


def test_the_client_sees_its_own_request_not_the_background_one(
    gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=20,seed=48,fault=reset,at=5,times=1"
    events = raw(gateway, model)
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "response.queued" not in [e["type"] for e in events]
    for event in events:
        if "response" in event:  # as OpenAI answers a request that did not ask for it
            assert event["response"]["background"] is False
            assert event["response"]["status"] != "queued"
            assert event["response"]["store"] is True
    asked = posts(chaos, model)[0].body
    assert asked["background"] is True and "store" not in asked


def test_a_client_that_asks_for_background_itself_sees_it(
    gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=20,seed=49,fault=reset,at=5,times=1"
    events = raw(gateway, model, background=True)
    assert [e["type"] for e in events][:3] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert events[0]["response"]["background"] is True
    assert events[-1]["type"] == "response.completed"
    assert len(posts(chaos, model)) == 1


def test_store_false_is_never_asked_in_the_background_and_is_continued(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=20,seed=50,fault=reset,at=9,times=1"
    before = retrieves(chaos)
    streamed = stream(sdk, model, store=False)
    assert streamed.text() == expected_answer(model).text
    first, continuation = posts(chaos, model)
    assert "background" not in first.body and "background" not in continuation.body
    assert retrieves(chaos) == before


def test_a_response_that_fails_upstream_is_continued_as_today(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=20,seed=51,fault=error,at=9,times=1"
    streamed = stream(sdk, model)
    assert streamed.text() == expected_answer(model).text
    assert len(posts(chaos, model)) == 2  # the failed generation, then a continuation


def test_a_cut_read_again_is_read_again_while_it_makes_progress(
    sdk: OpenAI, gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    spec = "chaos:text=40,seed=52,pace_ms=2"
    model = f"{spec},fault=reset,at=5,times=1,retrieve_faults=2"
    before = reattached(gateway)
    streamed = stream(sdk, model)
    assert streamed.text() == expected_answer(model).text
    assert len(posts(chaos, model)) == 1
    assert reattached(gateway) == before + 3  # the create cut, then two reads cut


def test_an_expired_response_gets_the_usual_plans(sdk: OpenAI) -> None:
    """The stall is noticed (idle 0.5 s) after the response ended and was forgotten
    (kept 0.05 s): the read again is a 404, and a continuation finishes the answer."""
    with running_chaos_upstream(background_ttl=0.05) as short:
        with running_gateway(config(short, **BACKGROUND)) as gateway:
            with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
                model = "chaos:text=20,seed=53,fault=stall,at=9,times=1"
                streamed = stream(client, model)
            assert streamed.text() == expected_answer(model).text
            assert reattached(gateway, "failed") == 1
            assert len(posts(short, model)) == 2  # the expired one, then a continuation


def test_an_abandoned_run_cancels_its_upstream_response(chaos: ChaosUpstream) -> None:
    """The client leaves mid-answer; past the detach grace nobody will read it, and the
    upstream's background response is cancelled rather than generated to its end."""
    with running_gateway(config(chaos, state={"detach_grace": 0.1}, **BACKGROUND)) as gateway:
        model = "chaos:text=400,seed=54,pace_ms=20"
        body = {"model": model, "input": "x", "stream": True}
        with httpx2.stream("POST", gateway.base_url + "/responses", json=body) as response:
            lines = response.iter_lines()
            created = next(line for line in lines if line.startswith("data: "))
        response_id = orjson.loads(created[6:])["response"]["id"]
        # Counted once the upstream answered the cancel (its status changes just before).
        cancels = gateway.metrics.upstream_cancels.labels("chaos", "cancelled")
        assert wait_for(lambda: cancels._value.get() == 1, 10)
        assert chaos.backgrounds.status(response_id) == "cancelled"
        time.sleep(0.1)
        assert [r.method for r in chaos.requests_for(model)] == ["POST"]


def test_the_streamed_events_of_a_read_again_validate_against_the_sdks_types(
    gateway: RunningGateway,
) -> None:
    model = "chaos:text=12,reasoning=4,tools=1,seed=55,fault=reset,at=8,times=1"
    events = raw(gateway, model)
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert events[-1]["type"] == "response.completed"


def test_an_upstream_that_refuses_background_gets_the_foreground_from_then_on() -> None:
    """An organisation under zero data retention (or a server that does not know it)
    refuses ``background``: the same leg is asked again at once without it, and that
    upstream and model are asked in the foreground from then on."""
    leg = Leg("resp_raw")
    answer = leg.created() + leg.message(0, "msg_a", "Hello", " there") + [leg.completed(2)]
    stream = sse_head() + b"".join(frame(c.obj["type"], c.data) for c in answer)
    refusal = orjson.dumps(
        {
            "error": {
                "message": "Background mode is not available for this organization.",
                "type": "invalid_request_error",
                "param": "background",
                "code": None,
            }
        }
    )

    def script(index: int, request: RawRequest) -> list[bytes]:
        if orjson.loads(request.body).get("background"):
            head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            return [head + b"content-length: %d\r\n\r\n" % len(refusal) + refusal]
        return [stream]

    with running_raw_upstream(script) as upstream:
        settings = {"upstream": {"background": True, "timeouts": {"first_byte": 3, "idle": 2}}}
        with running_gateway(gateway_config(upstream.base_url, **settings)) as gateway:
            with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
                for _ in range(2):
                    with client.responses.stream(model="m", input="x") as events:
                        assert events.get_final_response().output_text == "Hello there"
            refused = gateway.metrics.attempts.labels("chaos", "0", "background_refused")
            assert refused._value.get() == 1
    asked = [orjson.loads(r.body).get("background") for r in upstream.requests]
    assert asked == [True, None, None]


def test_cuts_at_random_positions_arrive_as_the_unbroken_answer_with_one_generation(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    """Seeded: every transport cut, anywhere in answers with reasoning and a function
    call or not, its reads again sometimes cut too."""
    rng = random.Random(47)
    for case in range(12):
        reasoning, tools = rng.choice((0, 4)), rng.choice((0, 1))
        spec = f"chaos:text=30,reasoning={reasoning},tools={tools},seed={4700 + case},pace_ms=1"
        unbroken = stream(sdk, spec)
        fault, at, again = rng.choice(CUTS), rng.randrange(45), rng.choice((0, 0, 1))
        model = f"{spec},fault={fault},at={at},times=1,retrieve_faults={again}"
        streamed = stream(sdk, model)
        assert comparable(streamed.events) == comparable(unbroken.events), model
        assert streamed.final.usage.output_tokens == unbroken.final.usage.output_tokens
        assert len(posts(chaos, model)) == 1, model


def test_a_clients_own_background_response_is_not_cancelled_when_it_leaves(
    chaos: ChaosUpstream,
) -> None:
    """A client that asked for ``background: true`` itself may read the response later,
    from the provider: its run abandoned, the response goes on."""
    with running_gateway(config(chaos, state={"detach_grace": 0.1}, **BACKGROUND)) as gateway:
        model = "chaos:text=60,seed=56,pace_ms=20"
        body = {"model": model, "input": "x", "stream": True, "background": True}
        with httpx2.stream("POST", gateway.base_url + "/responses", json=body) as response:
            lines = response.iter_lines()
            created = next(line for line in lines if line.startswith("data: "))
        response_id = orjson.loads(created[6:])["response"]["id"]
        assert wait_for(lambda: chaos.backgrounds.status(response_id) == "completed", 10)
        assert gateway.metrics.upstream_cancels.labels("chaos", "cancelled")._value.get() == 0
