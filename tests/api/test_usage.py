"""Usage after a recovery counts every leg the user pays for, on every protocol.

The chaos upstream bills one output token per content delta, and each request's input
as 10 + its turns. A leg that broke reported nothing (chat, Responses) or only its
input (Messages): the gateway estimates it (gateway/recovery/usage.py), so the output
a recovered answer reports is within 10% of the fault-free answer's. Input is not:
every leg sends the prompt again, and the provider bills each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from openai import OpenAI
from openai.types.responses import ResponseCompletedEvent, ResponseUsage

from gateway.chaos import ChaosUpstream
from tests.servers import RunningGateway, gateway_config, running_gateway

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "idle_retry_delay": 0.01}
# The chaos upstream counts ``times=`` per spec string: one seed per protocol.
SEEDS = {"chat": 70, "responses": 73, "messages": 74}
FAULTS = ["reset", "stall", "error", "close"]
POINTS = [0, 20, 45]  # before the text, early in it, late in it


@pytest.fixture(scope="module")
def gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    route = {"match": "*", "upstream": "chaos", "retry": FAST_RETRY}
    upstream = {
        "timeouts": {"connect": 2, "first_byte": 3, "idle": 0.5},
        "protocols": ["chat", "responses", "messages"],
    }
    with running_gateway(
        gateway_config(chaos.base_url, upstream=upstream, routes=[route])
    ) as running:
        yield running


@pytest.fixture
def openai_sdk(gateway: RunningGateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
        yield client


@pytest.fixture
def anthropic_sdk(gateway: RunningGateway) -> Iterator[anthropic.Anthropic]:
    base_url = gateway.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=base_url, api_key="k", max_retries=0) as client:
        yield client


def chat_usage(sdk: OpenAI, model: str) -> tuple[int, int]:
    chunks = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    [usage] = [chunk.usage for chunk in chunks if chunk.usage is not None]
    return usage.prompt_tokens, usage.completion_tokens


def responses_usage(sdk: OpenAI, model: str) -> tuple[int, int]:
    with sdk.responses.stream(model=model, input="Tell me.") as events:
        for _ in events:
            pass
        usage = events.get_final_response().usage
    assert usage is not None
    return usage.input_tokens, usage.output_tokens


def messages_usage(sdk: anthropic.Anthropic, model: str) -> tuple[int, int]:
    messages: Any = [{"role": "user", "content": "Tell me."}]
    events = sdk.messages.create(model=model, max_tokens=1000, messages=messages, stream=True)
    # Summed over legs in message_delta's usage (the SDK's stream helper keeps the input
    # of message_start, the first leg's).
    [delta] = [event for event in events if event.type == "message_delta"]
    assert delta.usage.input_tokens is not None
    return delta.usage.input_tokens, delta.usage.output_tokens


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("at", POINTS)
def test_usage_after_a_recovery_is_within_ten_percent_of_the_fault_free_answer(
    openai_sdk: OpenAI, anthropic_sdk: anthropic.Anthropic, protocol: str, fault: str, at: int
) -> None:
    def usage(model: str) -> tuple[int, int]:
        if protocol == "chat":
            return chat_usage(openai_sdk, model + ",usage=1")
        if protocol == "responses":
            return responses_usage(openai_sdk, model)
        return messages_usage(anthropic_sdk, model)

    answer = f"chaos:text=60,seed={SEEDS[protocol]}"
    clean_in, clean_out = usage(answer)
    recovered_in, recovered_out = usage(f"{answer},fault={fault},at={at},times=1")
    assert abs(recovered_out - clean_out) <= 0.1 * clean_out, (recovered_out, clean_out)
    # Every leg's prompt is billed: the broken one's too.
    assert recovered_in > clean_in


def test_a_continuation_that_reasons_again_costs_its_reasoning_too(openai_sdk: OpenAI) -> None:
    """A reasoning model thinks again on a continuation leg, and bills it: the recovered
    answer's output counts the broken leg's reasoning and text, then the new leg's."""
    answer = "chaos:text=40,reasoning=10,seed=72"
    _, clean_out = responses_usage(openai_sdk, answer)
    _, recovered_out = responses_usage(openai_sdk, answer + ",fault=reset,at=30,times=1")
    # 50 fault-free; 10 reasoning + 20 text on the broken leg, 10 + 20 (+1 anchor) after.
    assert clean_out == 50
    assert abs(recovered_out - (clean_out + 10)) <= 2


def test_a_synthesized_finish_has_whole_usage(openai_sdk: OpenAI) -> None:
    """A fault after a completed function call: the answer ends with it, no upstream
    call, and its usage is the broken leg's, estimated, never null."""
    model = "chaos:text=6,tools=2,arg_deltas=4,seed=71,fault=reset,at=14,times=1"
    with openai_sdk.responses.stream(model=model, input="Tell me.") as events:
        for _ in events:
            pass
        final = events.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    usage = final.usage
    assert usage is not None
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize("fault", ["reset", "error"])
def test_usage_keeps_every_field_through_a_recovery_and_validates_strictly(
    gateway: RunningGateway, fault: str
) -> None:
    """The upstream reports ``cache_write_tokens`` (openai 3.57 requires it) and counters
    nobody knows yet; after a recovery the summed usage still has them all, and the raw
    ``response.completed`` validates against the SDK's own type (not ``construct``)."""
    model = f"chaos:text=60,seed=75,usage_extra=3,fault={fault},at=20,times=1"
    body = {"model": model, "input": "Tell me.", "stream": True}
    raw = httpx2.post(gateway.base_url + "/responses", json=body, headers=AUTH, timeout=30)
    events = [orjson.loads(data) for data in _data_lines(raw.content)]
    [completed] = [e for e in events if e["type"] == "response.completed"]
    ResponseCompletedEvent.model_validate(completed, strict=False)
    usage = completed["response"]["usage"]
    ResponseUsage.model_validate(usage)
    # One leg broke (estimated: no details), one reported them: kept, with the unknown.
    assert usage["input_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "future_tokens": 3,
    }
    assert usage["future_usage"] == {"units": 3}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_a_synthesized_finish_validates_strictly_too(gateway: RunningGateway) -> None:
    """No leg reported usage (the answer ends with its completed call, no upstream call
    after the break): the estimate has the details the SDK's type requires."""
    model = "chaos:text=6,tools=2,arg_deltas=4,seed=76,fault=reset,at=14,times=1"
    body = {"model": model, "input": "Tell me.", "stream": True}
    raw = httpx2.post(gateway.base_url + "/responses", json=body, headers=AUTH, timeout=30)
    [completed] = [
        e for e in map(orjson.loads, _data_lines(raw.content)) if e["type"] == "response.completed"
    ]
    ResponseUsage.model_validate(completed["response"]["usage"])


AUTH = {"authorization": "Bearer k"}


def _data_lines(body: bytes) -> list[bytes]:
    return [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
