"""Gateway-only request fields (``fallbacks``): read by the gateway, never sent upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import MESSAGES, stream_chat
from tests.servers import RunningGateway, gateway_config, running_gateway

NO_RETRY = {"retries": 0, "backoff_initial": 0.01, "backoff_max": 0.05}


@pytest.fixture(scope="module")
def routed(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    """Only chaos models are routed; ``broken`` has a configured fallback that fails too."""
    routes: list[dict[str, Any]] = [
        {
            "match": "broken",
            "upstream": "chaos",
            "model": "chaos:text=30,seed=80,fault=reset,at=10",
            "fallbacks": [{"upstream": "chaos", "model": "chaos:text=30,seed=80,fault=http_503"}],
            "retry": NO_RETRY,
        },
        {"match": "chaos*", "upstream": "chaos", "retry": NO_RETRY},
    ]
    with running_gateway(gateway_config(chaos.base_url, routes=routes)) as running:
        yield running


@pytest.fixture
def sdk(routed: RunningGateway, chaos: ChaosUpstream) -> Iterator[OpenAI]:
    chaos.requests.clear()
    with OpenAI(base_url=routed.base_url, api_key="k", max_retries=0) as client:
        yield client


def sent_fields(chaos: ChaosUpstream) -> list[set[str]]:
    return [set(r.body) for r in chaos.requests if isinstance(r.body, dict)]


def test_request_fallbacks_finish_an_answer_the_primary_broke(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    clean = "chaos:text=30,seed=80"
    received = stream_chat(sdk, "broken", extra_body={"fallbacks": [clean]})
    assert received.text == expected_answer(clean).text
    assert len(received.ids) == 1 and received.finish_reasons == ["stop"]
    # The request's fallback replaced the route's own (which answers 503): never asked.
    models = [r.body["model"] for r in chaos.requests]
    assert models == ["chaos:text=30,seed=80,fault=reset,at=10", clean]
    assert all("fallbacks" not in fields for fields in sent_fields(chaos))


def test_non_streaming_request_fallbacks_never_reach_the_upstream(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    clean = "chaos:text=30,seed=80"
    completion = sdk.chat.completions.create(
        model="broken", messages=MESSAGES, extra_body={"fallbacks": [clean]}
    )
    assert completion.choices[0].message.content == expected_answer(clean).text
    assert len(chaos.requests) == 2
    assert all("fallbacks" not in fields for fields in sent_fields(chaos))


def test_empty_fallbacks_leave_only_the_primary(sdk: OpenAI, chaos: ChaosUpstream) -> None:
    with pytest.raises(openai.APIError, match="reset the connection"):
        stream_chat(sdk, "broken", extra_body={"fallbacks": []})
    assert len(chaos.requests) == 1


def test_fallbacks_are_not_sent_on_the_several_choices_relay(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    sdk.chat.completions.create(
        model="chaos:text=5", messages=MESSAGES, n=2, extra_body={"fallbacks": ["chaos"]}
    )
    (fields,) = sent_fields(chaos)
    assert "n" in fields and "fallbacks" not in fields


def test_fallbacks_are_not_sent_on_pass_through(sdk: OpenAI, chaos: ChaosUpstream) -> None:
    sdk.embeddings.create(model="chaos", input="hello", extra_body={"fallbacks": ["chaos"]})
    (request,) = chaos.requests
    assert request.path.endswith("/embeddings")
    assert "input" in request.body and "fallbacks" not in request.body


@pytest.mark.parametrize(
    ("fallbacks", "says"),
    [
        ("chaos", "must be a list of model names"),
        ([""], "must be a list of model names"),
        ([{"model": "chaos"}], "must be a list of model names"),
        (["chaos", "gpt-nowhere"], "fallbacks\\[1\\]: the model 'gpt-nowhere' does not exist"),
        (["chaos"] * 9, "at most 8"),
    ],
    ids=["not-a-list", "empty-name", "not-a-name", "unrouted", "too-many"],
)
def test_bad_fallbacks_get_a_clear_400_and_reach_no_upstream(
    sdk: OpenAI, chaos: ChaosUpstream, fallbacks: object, says: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=says) as raised:
        stream_chat(sdk, "chaos:text=5", extra_body={"fallbacks": fallbacks})
    error = raised.value.body
    assert isinstance(error, dict)
    assert error["param"] == "fallbacks" and error["code"] == "invalid_fallbacks"
    assert error["type"] == "invalid_request_error"
    assert chaos.requests == []
