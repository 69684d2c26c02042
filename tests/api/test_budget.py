"""The client's output budget across legs, on every door (ARCHITECTURE.md 6b, rule 4).

A continuation asks for what is left of ``max_tokens`` (and kin) after the tokens the
legs before it produced; when nothing is left, the answer ends there as the unbroken
one would have (``length``, ``incomplete``, ``max_tokens``, ``MAX_TOKENS``) without
another upstream call. The chaos upstream streams one delta per token and ignores the
budget itself, so what the gateway asked for is read off its requests; the real model
(tests/realmodel) shows the answers come out byte-equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types
from openai import OpenAI, omit

from gateway.chaos import ChaosUpstream
from tests.servers import RunningGateway, gateway_config, running_gateway

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "idle_retry_delay": 0.01}
CUT = 10  # content deltas the client has when the first leg resets: 10 tokens spent
ROUTES = [{"match": "*", "upstream": "chaos", "retry": FAST_RETRY}]


def cut_at(seed: int) -> str:
    return f"chaos:text=40,seed={seed},fault=reset,at={CUT},times=1"


@pytest.fixture(scope="module")
def openai_door(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(gateway_config(chaos.base_url, routes=ROUTES)) as running:
        yield running


@pytest.fixture
def sdk(openai_door: RunningGateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=openai_door.base_url, api_key="k", max_retries=0) as client:
        yield client


def chat(sdk: OpenAI, model: str, **budget: int) -> tuple[str, list[str]]:
    text, finish = "", list[str]()
    stream = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Go."}],
        stream=True,
        max_tokens=budget.get("max_tokens", omit),
        max_completion_tokens=budget.get("max_completion_tokens", omit),
    )
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish += [choice.finish_reason] if choice.finish_reason else []
    return text, finish


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chat_continuation_asks_for_what_is_left_of_the_budget(
    sdk: OpenAI, chaos: ChaosUpstream, field: str
) -> None:
    model = cut_at(41 + len(field))
    _, finish = chat(sdk, model, **{field: 25})
    first, continuation = chaos.requests_for(model)
    assert (first.body[field], continuation.body[field]) == (25, 25 - CUT)
    assert finish == ["stop"]


def test_both_chat_budgets_set_the_lower_one_rules_and_both_are_lowered(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    model = cut_at(42)
    chat(sdk, model, max_tokens=30, max_completion_tokens=20)
    continuation = chaos.requests_for(model)[-1].body
    assert (continuation["max_tokens"], continuation["max_completion_tokens"]) == (10, 10)


@pytest.mark.parametrize("budget", [CUT, CUT - 4])
def test_a_chat_answer_whose_budget_is_spent_ends_with_length_and_no_other_call(
    sdk: OpenAI, chaos: ChaosUpstream, budget: int
) -> None:
    model = cut_at(43 + budget)
    text, finish = chat(sdk, model, max_tokens=budget)
    assert text and finish == ["length"]
    assert len(chaos.requests_for(model)) == 1


def test_a_responses_answer_whose_budget_is_spent_is_incomplete(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    model = cut_at(44)
    deltas, terminal = "", []
    with sdk.responses.stream(model=model, input="Go.", max_output_tokens=CUT) as stream:
        for event in stream:  # the SDK's own helper checks the events' order
            if event.type == "response.output_text.delta":
                deltas += event.delta
            elif event.type in ("response.completed", "response.incomplete"):
                terminal.append(event.response)
    [final] = terminal
    assert final.status == "incomplete"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    assert deltas and final.output_text == deltas
    assert len(chaos.requests_for(model)) == 1


def test_a_responses_continuation_asks_for_what_is_left(sdk: OpenAI, chaos: ChaosUpstream) -> None:
    model = cut_at(45)
    with sdk.responses.stream(model=model, input="Go.", max_output_tokens=100) as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    assert chaos.requests_for(model)[-1].body["max_output_tokens"] == 100 - CUT


@pytest.fixture(scope="module")
def anthropic_door(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    root = chaos.base_url.removesuffix("/v1")
    upstream: dict[str, Any] = {"kind": "anthropic"}
    with running_gateway(gateway_config(root, upstream=upstream, routes=ROUTES)) as running:
        yield running


@pytest.mark.parametrize(("budget", "stop", "calls"), [(CUT, "max_tokens", 1), (64, "end_turn", 2)])
def test_messages_keep_max_tokens_across_legs(
    anthropic_door: RunningGateway, chaos: ChaosUpstream, budget: int, stop: str, calls: int
) -> None:
    model = cut_at(46 + budget)
    with (
        anthropic.Anthropic(base_url=anthropic_door.url, api_key="k", max_retries=0) as client,
        client.messages.stream(
            model=model, max_tokens=budget, messages=[{"role": "user", "content": "Go."}]
        ) as stream,
    ):
        message = stream.get_final_message()
    assert message.stop_reason == stop
    requests = chaos.requests_for(model)
    assert len(requests) == calls
    if calls == 2:  # Messages' message_start counts 1 output token of its own, a floor
        assert requests[-1].body["max_tokens"] == budget - CUT


@pytest.fixture(scope="module")
def gemini_door(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    root = chaos.base_url.removesuffix("/v1") + "/v1beta"
    upstream: dict[str, Any] = {"kind": "gemini"}
    with running_gateway(gateway_config(root, upstream=upstream, routes=ROUTES)) as running:
        yield running


@pytest.mark.parametrize(("budget", "finish", "calls"), [(CUT, "MAX_TOKENS", 1), (64, "STOP", 2)])
def test_gemini_keeps_max_output_tokens_across_legs(
    gemini_door: RunningGateway, chaos: ChaosUpstream, budget: int, finish: str, calls: int
) -> None:
    model = cut_at(47 + budget)
    options = types.HttpOptions(
        base_url=gemini_door.url,
        api_version="v1beta",
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    client = genai.Client(api_key="k", http_options=options)
    chunks = list(
        client.models.generate_content_stream(
            model=model,
            contents="Go.",
            config=types.GenerateContentConfig(max_output_tokens=budget),
        )
    )
    candidate = (chunks[-1].candidates or [])[0]
    assert candidate.finish_reason == finish
    requests = chaos.requests_for(model)
    assert len(requests) == calls
    if calls == 2:
        assert requests[-1].body["generationConfig"]["maxOutputTokens"] == budget - CUT


def test_a_refusal_when_the_budget_is_spent_is_still_the_explicit_error(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    # A fatal in-band error (a content policy's) is surfaced, never turned into a clean
    # finish with length because the budget happens to be spent too.
    model = f"chaos:text=40,seed=49,fault=error_fatal,at={CUT},times=1"
    with pytest.raises(openai.APIError):
        chat(sdk, model, max_tokens=CUT)
    assert len(chaos.requests_for(model)) == 1
