"""Mid-stream recovery end to end: real sockets, the chaos upstream, the openai SDK.

Answers are deterministic, so "the client saw one unbroken answer" is checked
byte for byte against the chaos upstream's uninterrupted answer.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import MESSAGES, Received, calls_of, receive, stream_chat
from tests.servers import (
    FAST_RETRY,
    RunningGateway,
    gateway_config,
    recovering_config,
    running_gateway,
)

FAULTS = ["reset", "close", "stall", "error", "error_done", "no_finish", "finish_error"]


def config(chaos: ChaosUpstream, **overrides: Any) -> Any:
    return recovering_config(chaos.base_url, **overrides)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("at", [0, 9, 30], ids=["before-content", "mid-text", "after-last"])
def test_text_answer_survives_every_fault_at_every_point(sdk: OpenAI, fault: str, at: int) -> None:
    model = f"chaos:text=30,seed=20,fault={fault},at={at},times=1"
    received = stream_chat(sdk, model)
    assert received.text == expected_answer(model).text
    assert received.roles == ["assistant"] and received.finish_reasons == ["stop"]
    assert len(received.ids) == 1


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize(
    ("at", "calls"),
    [
        (0, 2),  # nothing sent: whole restart, both calls arrive whole
        (4, 2),  # mid-text: continue, then both calls
        (10, 2),  # text + half of call 0: truncate before it, continue, both calls
        (14, 1),  # call 0 complete, call 1 not begun: finish with call 0, no upstream call
        (22, 2),  # both complete: finish with both
    ],
    ids=["before-content", "mid-text", "mid-arguments", "between-calls", "after-last"],
)
def test_tool_answer_survives_every_fault_at_every_point(
    sdk: OpenAI, fault: str, at: int, calls: int
) -> None:
    model = f"chaos:text=6,tools=2,arg_deltas=8,seed=21,fault={fault},at={at},times=1"
    received = stream_chat(sdk, model)
    assert received.text == expected_answer(model).text
    assert received.calls() == calls_of(model, calls)
    assert received.finish_reasons == ["tool_calls"]
    indices = sorted(received.tool_calls)
    assert indices == list(range(len(indices)))


def test_completed_tool_call_finishes_without_another_upstream_call(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=3,tools=2,arg_deltas=4,seed=22,fault=reset,at=7,times=1"
    chaos.requests.clear()
    received = stream_chat(sdk, model)
    assert received.calls() == calls_of(model, 1)
    assert len(chaos.requests) == 1


def test_continuation_request_carries_the_sent_text_as_prefix(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=20,seed=23,fault=reset,at=8,times=1"
    chaos.requests.clear()
    received = stream_chat(sdk, model)
    assert received.text == expected_answer(model).text
    first, second = chaos.requests
    prefix, prompt = second.body["messages"][-2:]
    assert second.body["messages"][:-2] == first.body["messages"]
    assert prefix["role"] == "assistant"
    assert expected_answer(model).text.startswith(prefix["content"]) and prefix["content"]
    assert prompt["role"] == "user" and "cut off" in prompt["content"]


@settings(max_examples=20, deadline=None)
@given(
    at=st.integers(min_value=0, max_value=45),
    seed=st.integers(min_value=0, max_value=10_000),
    fault=st.sampled_from(["reset", "close", "error", "no_finish"]),
    split=st.sampled_from([0, 1, 7]),
)
def test_any_fault_position_and_chunking_gives_the_same_utf8_text(
    recovering: RunningGateway, at: int, seed: int, fault: str, split: int
) -> None:
    wire = f",split={split}" if split else ""
    model = f"chaos:text=40,seed={seed},fault={fault},at={at},times=1{wire}"
    with OpenAI(base_url=recovering.base_url, api_key="k", max_retries=0) as client:
        assert stream_chat(client, model).text == expected_answer(model).text


def test_two_interruptions_in_one_run(sdk: OpenAI, chaos: ChaosUpstream) -> None:
    model = "chaos:text=30,seed=24,fault=reset,at=6,times=2"
    chaos.requests.clear()
    assert stream_chat(sdk, model).text == expected_answer(model).text
    assert len(chaos.requests) == 3


def test_the_anchor_a_prompt_continuation_repeats_is_cut_and_counted(
    sdk: OpenAI, recovering: RunningGateway, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=30,seed=25,fault=reset,at=10,times=1"
    registry = recovering.metrics.registry
    before = registry.get_sample_value("gateway_seam_trimmed_characters_total") or 0
    echoes = registry.get_sample_value("gateway_seams_total", {"cut": "echo"}) or 0
    assert stream_chat(sdk, model).text == expected_answer(model).text
    prompt = chaos.requests_for(model)[-1].body["messages"][-1]["content"]
    anchor = prompt[prompt.rindex("<<<") + 3 : -3]
    assert anchor and expected_answer(model).text.count(anchor)  # quoted from the answer
    after = registry.get_sample_value("gateway_seam_trimmed_characters_total")
    assert after is not None and after - before == len(anchor)
    assert registry.get_sample_value("gateway_seams_total", {"cut": "echo"}) == echoes + 1


def test_a_model_that_ignores_the_anchor_is_never_shown_and_a_verified_replay_finishes(
    sdk: OpenAI, recovering: RunningGateway, chaos: ChaosUpstream
) -> None:
    # anchor=0: the reply goes on without the quoted anchor. It may well be right, but
    # nothing says so: it is not shown. The client's request again (deterministic here)
    # begins with everything the client has: kept, with that cut.
    model = "chaos:text=60,seed=25,fault=reset,at=10,times=1,anchor=0"
    registry = recovering.metrics.registry

    def count(name: str, labels: dict[str, str]) -> float:
        return registry.get_sample_value(name, labels) or 0

    diverged = count("gateway_seams_total", {"cut": "diverged"})
    restarts = count("gateway_seams_total", {"cut": "restart"})
    replays = count("gateway_recoveries_total", {"plan": "verified_replay", "outcome": "recovered"})
    assert stream_chat(sdk, model).text == expected_answer(model).text
    assert count("gateway_seams_total", {"cut": "diverged"}) == diverged + 1
    assert count("gateway_seams_total", {"cut": "restart"}) == restarts + 1
    plan = {"plan": "verified_replay", "outcome": "recovered"}
    assert count("gateway_recoveries_total", plan) == replays + 1
    first, continuation, replay = chaos.requests_for(model)
    assert continuation.body["messages"][-1]["role"] == "user"  # the prompt-mode ask
    assert replay.body["messages"] == first.body["messages"]  # the client's own request


def test_a_replay_that_does_not_repeat_what_was_sent_ends_with_the_explicit_error(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    # sample=1: every request says other text, so neither the continuation (no anchor)
    # nor the replay follows what the client has: an error, never a spliced answer.
    model = "chaos:text=60,seed=25,fault=reset,at=10,times=1,anchor=0,sample=1"
    text = ""
    stream = sdk.chat.completions.create(model=model, messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match="does not follow the answer"):
        for chunk in stream:
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert text  # the first leg's deltas, and nothing of the two replies after them
    assert len(chaos.requests_for(model)) == 3  # the first, the continuation, the replay


SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "story", "schema": {"type": "object"}, "strict": True},
}


@pytest.mark.parametrize("response_format", [SCHEMA, {"type": "json_object"}])
def test_structured_output_is_finished_by_a_verified_replay_not_a_continuation(
    sdk: OpenAI, chaos: ChaosUpstream, response_format: dict[str, Any]
) -> None:
    # A continuation would open a new document mid-string (prompt mode) or another one
    # (a server's grammar does not carry the prefix's state): the request again instead.
    model = f"chaos:text=40,seed={len(str(response_format))},fault=reset,at=10,times=1"
    received = stream_chat(sdk, model, response_format=response_format)
    assert received.text == expected_answer(model).text
    first, replay = chaos.requests_for(model)
    assert replay.body == first.body  # no continuation prompt, no prefill: the same ask


@pytest.mark.parametrize("fault", ["http_503", "http_429", "http_500", "reset_before"])
def test_errors_before_the_stream_are_retried(sdk: OpenAI, fault: str) -> None:
    model = f"chaos:text=10,seed=26,fault={fault},times=2"
    assert stream_chat(sdk, model).text == expected_answer(model).text


def test_retry_after_is_honoured(sdk: OpenAI) -> None:
    model = "chaos:text=5,seed=27,fault=http_429_retry,retry_after=1,times=1"
    started = time.monotonic()
    assert stream_chat(sdk, model).text == expected_answer(model).text
    assert time.monotonic() - started >= 1  # the configured backoff alone is 10-50 ms


def test_malformed_event_mid_stream_is_skipped(sdk: OpenAI) -> None:
    model = "chaos:text=20,seed=28,fault=malformed,at=7"
    assert stream_chat(sdk, model).text == expected_answer(model).text


def test_non_streaming_request_is_recovered(sdk: OpenAI) -> None:
    model = "chaos:text=25,tools=1,seed=29,fault=reset,at=12,times=1,usage=1"
    completion = sdk.chat.completions.create(model=model, messages=MESSAGES)
    message = completion.choices[0].message
    assert message.content == expected_answer(model).text
    assert [
        (c.id, c.function.name, c.function.arguments)
        for c in message.tool_calls or []
        if c.type == "function"
    ] == calls_of(model)
    assert completion.usage is not None
    assert completion.usage.completion_tokens > len(expected_answer(model).text) // 100


def test_one_usage_chunk_after_a_recovery(sdk: OpenAI) -> None:
    # A leg that breaks never reports usage: it is estimated (gateway/recovery/usage.py)
    # and summed with the continuation leg's report.
    model = "chaos:text=20,seed=30,fault=reset,at=8,times=1,usage=1"
    recovered = stream_chat(sdk, model, stream_options={"include_usage": True})
    assert recovered.text == expected_answer(model).text
    assert len(recovered.usage) == 1
    # The continuation's 12 deltas and the anchor it quoted back (13, as reported), and
    # the broken leg's 8 deltas at the continuation's one token per delta.
    assert recovered.usage[0].completion_tokens == 8 + 12 + 1


def test_a_finish_with_the_completed_calls_after_a_break_sends_one_usage_chunk(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    # The leg breaks after tool_0 is whole: no upstream call follows, and the broken
    # leg never reported usage, yet the client asked for it (the outside soak's case):
    # its usage is estimated (gateway/recovery/usage.py), never zeros.
    model = "chaos:text=2,tools=2,arg_deltas=2,seed=33,fault=reset,at=5,times=1,usage=1"
    chaos.requests.clear()
    received = stream_chat(sdk, model, stream_options={"include_usage": True})
    assert received.finish_reasons == ["tool_calls"] and len(received.tool_calls) == 1
    assert len(chaos.requests) == 1
    [usage] = received.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_failed_run_sends_its_usage_chunk_before_the_error(sdk: OpenAI) -> None:
    received = Received()
    with pytest.raises(openai.APIError, match="content"):
        receive(
            sdk.chat.completions.create(
                model="chaos:text=20,seed=34,fault=error_fatal,at=5,times=1,usage=1",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            ),
            received,
        )
    assert len(received.usage) == 1 and received.text


def test_budget_spent_ends_with_an_error_naming_the_dropped_tool(
    chaos: ChaosUpstream, recovering: RunningGateway
) -> None:
    # Every attempt breaks in the middle of the call's arguments.
    model = "chaos:text=2,tools=1,arg_deltas=6,seed=31,fault=reset,at=4"
    chaos.requests.clear()
    received = Received()
    with OpenAI(base_url=recovering.base_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.APIError, match="tool_0") as raised:
            receive(
                client.chat.completions.create(model=model, messages=MESSAGES, stream=True),
                received,
            )
    assert "reset the connection" in raised.value.message
    assert received.text == expected_answer(model).text  # the text the client had is intact
    assert received.tool_calls == {} and received.finish_reasons == []
    assert len(chaos.requests) == 3  # one attempt + the default two retries


def test_fatal_in_band_error_is_surfaced_not_retried(sdk: OpenAI, chaos: ChaosUpstream) -> None:
    chaos.requests.clear()
    with pytest.raises(openai.APIError, match="content"):
        stream_chat(sdk, "chaos:text=20,seed=32,fault=error_fatal,at=5,times=1")
    assert len(chaos.requests) == 1


class TestLegs:
    def test_primary_cut_is_finished_by_the_fallback(self, chaos: ChaosUpstream) -> None:
        broken = "chaos:text=30,seed=40,fault=reset,at=10"
        clean = "chaos:text=30,seed=40"
        route = {"model": broken, "fallbacks": [{"upstream": "chaos", "model": clean}]}
        chaos.requests.clear()
        with (
            running_gateway(
                config(chaos, route=route | {"retry": FAST_RETRY | {"retries": 0}})
            ) as gw,
            OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
        ):
            received = stream_chat(client, "anything")
        assert received.text == expected_answer(clean).text
        assert [r.body["model"] for r in chaos.requests] == [broken, clean]
        assert len(received.ids) == 1 and len(received.roles) == 1

    def test_rejected_continuation_never_masks_the_original_failure(
        self, chaos: ChaosUpstream
    ) -> None:
        broken = "chaos:text=30,seed=41,fault=reset,at=10"
        refusing = "chaos:text=30,seed=41,fault=http_400"
        route = {
            "model": broken,
            "retry": FAST_RETRY | {"retries": 0},
            "fallbacks": [{"upstream": "chaos", "model": refusing}],
        }
        with (
            running_gateway(config(chaos, route=route)) as gw,
            OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
        ):
            with pytest.raises(openai.APIError, match="reset the connection"):
                stream_chat(client, "anything")
            # With a third leg that works, the answer completes after the refusal.
            route["fallbacks"] = [
                *route["fallbacks"],
                {"upstream": "chaos", "model": "chaos:text=30,seed=41"},
            ]
        with (
            running_gateway(config(chaos, route=route)) as gw,
            OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
        ):
            assert stream_chat(client, "anything").text == expected_answer(broken).text

    def test_no_continuation_capability_fails_cleanly_after_text(
        self, chaos: ChaosUpstream
    ) -> None:
        cfg = gateway_config(
            chaos.base_url,
            upstream={"continuation": "none", "timeouts": {"idle": 0.5}},
            routes=[{"match": "*", "upstream": "chaos", "retry": FAST_RETRY}],
        )
        with (
            running_gateway(cfg) as gw,
            OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client,
        ):
            with pytest.raises(openai.APIError, match="reset the connection"):
                stream_chat(client, "chaos:text=20,seed=42,fault=reset,at=5,times=1")
            # Nothing sent yet: a whole restart needs no continuation capability.
            model = "chaos:text=20,seed=42,fault=reset,at=0,times=1"
            assert stream_chat(client, model).text == expected_answer(model).text


def test_cancellation_during_backoff_ends_the_run_at_once(chaos: ChaosUpstream) -> None:
    slow = FAST_RETRY | {"backoff_initial": 5, "backoff_max": 5}
    body = {"model": "chaos:text=20,seed=43,fault=reset,at=5", "messages": MESSAGES, "stream": True}
    # No detach grace: the run is cancelled as soon as its only client leaves.
    cfg = config(chaos, route={"retry": slow}, state={"detach_grace": 0})
    with running_gateway(cfg) as gw:
        chaos.requests.clear()
        with httpx2.stream("POST", gw.base_url + "/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if '"content"' in line and len(chaos.requests) == 1:
                    break
            time.sleep(0.3)  # the stream broke; the run now sleeps in its 2.5-5 s backoff
        deadline = time.monotonic() + 2
        while gw.metrics.registry.get_sample_value("gateway_active_streams"):
            assert time.monotonic() < deadline, "the run outlived its client"
            time.sleep(0.02)
        time.sleep(0.5)
    assert len(chaos.requests) == 1  # no attempt after the client left


def test_one_log_line_per_recovery(sdk: OpenAI, caplog: pytest.LogCaptureFixture) -> None:
    model = "chaos:text=20,seed=44,fault=reset,at=5,times=1"
    with caplog.at_level(logging.INFO, logger="gateway.run"):
        stream_chat(sdk, model)
    [line] = [vars(r) for r in caplog.records if r.getMessage() == "recovery"]
    fields = {k: line[k] for k in ("cause", "plan", "attempt", "leg", "upstream")}
    assert fields == {
        "cause": "reset",
        "plan": "continue_text",
        "attempt": 1,
        "leg": 0,
        "upstream": "chaos",
    }
    assert re.fullmatch(r"[0-9a-f]{32}", line["run_id"])
