"""Continuation requests: an assistant prefix of the answer resumes it at that character."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.chaos import ChaosUpstream, expected_answer, running_chaos_upstream
from gateway.chaos.answer import script_for
from gateway.chaos.spec import parse_spec

from .helpers import USER, stream

TEXT = expected_answer("chaos").text
CONTINUE = {"role": "user", "content": "Continue exactly where you left off."}


def _prompt(prefix: str) -> list[dict[str, Any]]:
    return [USER, {"role": "assistant", "content": prefix}, CONTINUE]


def _cuts() -> list[int]:
    starts = script_for(parse_spec("chaos")).starts
    zwj = TEXT.index("👩\u200d💻")
    cjk = TEXT.index("你好")
    return [
        1,  # inside the first delta
        starts[5],  # exactly on a delta boundary
        starts[5] + 1,
        zwj + 1,  # between the woman and the zero-width joiner
        zwj + 2,  # between the joiner and the laptop
        cjk + 1,  # inside a CJK word
        len(TEXT) - 1,
        len(TEXT),  # the whole text: only the finish is left
    ]


@pytest.mark.parametrize("cut", _cuts())
def test_prompt_shape_returns_exactly_the_rest(client: httpx2.Client, cut: int) -> None:
    received = stream(client, "chaos", _prompt(TEXT[:cut]))
    collected = received.collect()
    assert collected.text == TEXT[cut:]
    assert collected.finish_reasons == ["stop"]
    assert received.data[-1] == "[DONE]"


def test_resumes_with_the_remainder_of_the_delta_then_whole_deltas(client: httpx2.Client) -> None:
    script = script_for(parse_spec("chaos"))
    cut = script.starts[4] + 2
    received = stream(client, "chaos", _prompt(TEXT[:cut]))
    chunks = [json.loads(item) for item in received.data[1:-2]]  # between role and finish
    contents = [chunk["choices"][0]["delta"]["content"] for chunk in chunks]
    assert contents == [script.text_deltas[4][2:], *script.text_deltas[5:]]


def test_vllm_shape(client: httpx2.Client) -> None:
    messages = [USER, {"role": "assistant", "content": TEXT[:23]}]
    received = stream(client, "chaos", messages, continue_final_message=True)
    assert received.collect().text == TEXT[23:]


def test_prefix_shape(client: httpx2.Client) -> None:
    messages: list[dict[str, Any]] = [
        USER,
        {"role": "assistant", "content": TEXT[:31], "prefix": True},
    ]
    assert stream(client, "chaos", messages).collect().text == TEXT[31:]


def test_a_prefix_of_something_else_is_a_fresh_request(client: httpx2.Client) -> None:
    received = stream(client, "chaos", _prompt("Once upon a time"))
    assert received.collect().text == TEXT


def test_an_assistant_message_without_a_continue_flag_is_a_fresh_request(
    client: httpx2.Client,
) -> None:
    messages = [USER, {"role": "assistant", "content": TEXT[:10]}]
    assert stream(client, "chaos", messages).collect().text == TEXT


def test_tool_calls_come_whole_after_the_text(client: httpx2.Client) -> None:
    spec = "chaos:text=6,tools=2"
    answer = expected_answer(spec)
    collected = stream(client, spec, _prompt(answer.text[:9])).collect()
    assert collected.text == answer.text[9:]
    assert [call["arguments"] for call in collected.tool_calls.values()] == [
        call.arguments for call in answer.tool_calls
    ]
    assert collected.finish_reasons == ["tool_calls"]


def test_reasoning_is_emitted_again(client: httpx2.Client) -> None:
    spec = "chaos:text=6,reasoning=2"
    answer = expected_answer(spec)
    collected = stream(client, spec, _prompt(answer.text[:5])).collect()
    assert collected.reasoning == answer.reasoning
    assert collected.text == answer.text[5:]


def test_echo_repeats_the_tail_of_the_prefix(client: httpx2.Client) -> None:
    received = stream(client, "chaos:echo=4", _prompt(TEXT[:20]))
    assert received.collect().text == TEXT[16:20] + TEXT[20:]


def test_echo_prefix_repeats_the_whole_prefix(client: httpx2.Client) -> None:
    messages: list[dict[str, Any]] = [
        USER,
        {"role": "assistant", "content": TEXT[:20], "prefix": True},
    ]
    assert stream(client, "chaos:echo_prefix=1", messages).collect().text == TEXT


def test_fault_position_counts_from_the_start_of_the_continuation(client: httpx2.Client) -> None:
    script = script_for(parse_spec("chaos"))
    cut = script.starts[10] + 1
    received = stream(client, "chaos:fault=close,at=2", _prompt(TEXT[:cut]))
    assert isinstance(received.error, httpx2.RemoteProtocolError)
    assert received.collect().text == script.text_deltas[10][1:] + script.text_deltas[11]


def test_a_reset_then_its_continuation_rebuild_the_answer(client: httpx2.Client) -> None:
    spec = "chaos:text=30,fault=reset,at=13,times=1"
    first = stream(client, spec)
    assert first.error is not None
    prefix = first.collect().text
    rest = stream(client, spec, _prompt(prefix))
    assert rest.error is None
    assert prefix + rest.collect().text == expected_answer(spec).text


def test_non_streaming_continuation(client: httpx2.Client) -> None:
    body = {"model": "chaos:echo=2", "messages": _prompt(TEXT[:12])}
    message = client.post("/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["content"] == TEXT[10:]


@pytest.fixture(scope="module")
def shared_upstream() -> Iterator[ChaosUpstream]:
    with running_chaos_upstream() as upstream:
        yield upstream


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(min_value=1, max_value=10_000), split=st.sampled_from([0, 1, 2, 3, 5]))
def test_any_cut_over_any_split_resumes_byte_exact(
    shared_upstream: ChaosUpstream, cut: int, split: int
) -> None:
    spec = "chaos:text=15,seed=9" + (f",split={split}" if split else "")
    text = expected_answer(spec).text
    cut = 1 + cut % len(text)
    with httpx2.Client(base_url=shared_upstream.base_url, timeout=10) as client:
        received = stream(client, spec, _prompt(text[:cut]))
    assert text[:cut] + received.collect().text == text
