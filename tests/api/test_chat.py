"""POST /v1/chat/completions through a real gateway, chaos upstream and openai SDK."""

from __future__ import annotations

import logging
import time

import httpx2
import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer, running_chaos_upstream
from tests.api.streams import MESSAGES, Received, receive, stream_chat
from tests.processes import wait_until
from tests.servers import RunningGateway, gateway_config, running_gateway


def test_stream_relays_exactly_the_upstream_text(client: OpenAI) -> None:
    model = "chaos:text=60,seed=3"
    received = stream_chat(client, model)
    assert received.text == expected_answer(model).text
    assert received.roles == ["assistant"]
    assert received.finish_reasons == ["stop"]
    assert len(received.ids) == 1


def test_2000_deltas_arrive_complete_and_in_order(client: OpenAI) -> None:
    model = "chaos:text=2000,seed=4"
    received = stream_chat(client, model)
    assert received.text == expected_answer(model).text
    assert received.chunks == 2002  # role, 2000 deltas, finish


def test_stream_tool_calls_arrive_whole(client: OpenAI) -> None:
    model = "chaos:text=5,tools=2,arg_deltas=6,seed=5"
    received = stream_chat(client, model)
    answer = expected_answer(model)
    assert received.text == answer.text
    assert received.calls() == [(c.id, c.name, c.arguments) for c in answer.tool_calls]
    assert received.finish_reasons == ["tool_calls"]


def test_reasoning_deltas_are_relayed(client: OpenAI) -> None:
    model = "chaos:reasoning=4,text=6"
    received = stream_chat(client, model)
    answer = expected_answer(model)
    assert (received.reasoning, received.text) == (answer.reasoning, answer.text)


def test_usage_chunk_is_relayed_when_the_client_asks(client: OpenAI) -> None:
    model = "chaos:text=7,usage=1"
    received = stream_chat(client, model, stream_options={"include_usage": True})
    assert len(received.usage) == 1
    assert received.usage[0].completion_tokens > 0
    assert stream_chat(client, model).usage == []


@pytest.mark.parametrize("wire", ["lineend=crlf", "lineend=cr", "comments=1", "split=1"])
def test_upstream_wire_variants_decode_to_the_same_answer(client: OpenAI, wire: str) -> None:
    model = f"chaos:text=40,tools=1,seed=6,{wire}"
    received = stream_chat(client, model)
    answer = expected_answer(model)
    assert received.text == answer.text
    assert received.calls() == [(c.id, c.name, c.arguments) for c in answer.tool_calls]


def test_malformed_event_is_skipped_and_counted(client: OpenAI, gateway: RunningGateway) -> None:
    model = "chaos:text=20,fault=malformed,at=5,seed=7"
    received = stream_chat(client, model)
    assert received.text == expected_answer(model).text
    skipped = gateway.metrics.registry.get_sample_value(
        "gateway_upstream_malformed_events_total", {"upstream": "chaos"}
    )
    assert skipped == 1


def test_non_stream_assembles_the_completion(client: OpenAI, chaos: ChaosUpstream) -> None:
    model = "chaos:text=30,tools=1,seed=8,usage=1"
    completion = client.chat.completions.create(model=model, messages=MESSAGES)
    answer = expected_answer(model)
    message = completion.choices[0].message
    assert message.content == answer.text
    calls = [c for c in message.tool_calls or [] if c.type == "function"]
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c.id, c.name, c.arguments) for c in answer.tool_calls
    ]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    # The gateway streamed from the upstream to be able to recover.
    sent = chaos.requests[-1].body
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_run_id_header_is_returned(gateway: RunningGateway) -> None:
    response = httpx2.post(
        gateway.base_url + "/chat/completions",
        json={"model": "chaos:text=3", "messages": MESSAGES, "stream": True},
    )
    assert len(response.headers["x-run-id"]) == 32
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.endswith("data: [DONE]\n\n")
    assert response.text.count("data: [DONE]") == 1


@pytest.mark.parametrize(
    "fault", ["reset", "close", "stall", "error", "error_done", "no_finish", "finish_error"]
)
def test_broken_stream_ends_with_an_error_the_sdk_raises(client: OpenAI, fault: str) -> None:
    """Without recovery, a broken answer must never look complete (contract 2.6)."""
    model = f"chaos:text=30,fault={fault},at=10,seed=9,stall_s=10"
    received = Received()
    with pytest.raises(openai.APIError):
        receive(
            client.chat.completions.create(model=model, messages=MESSAGES, stream=True),
            received,
        )
    assert expected_answer(model).text.startswith(received.text)
    assert received.text  # the client kept what it had
    assert received.finish_reasons == []


def test_in_band_error_after_done_is_still_an_error(gateway: RunningGateway) -> None:
    response = httpx2.post(
        gateway.base_url + "/chat/completions",
        json={"model": "chaos:text=8,fault=error_done,at=4", "messages": MESSAGES, "stream": True},
    )
    assert "[DONE]" not in response.text
    assert '"error"' in response.text.rstrip().splitlines()[-1]


def test_client_disconnect_closes_the_upstream_once_the_detach_grace_ends() -> None:
    body = {"model": "chaos:text=2000,pace_ms=20,seed=10", "messages": MESSAGES, "stream": True}
    # A chaos upstream of its own: the shared one also counts connections that other
    # tests' gateways are still closing.
    with running_chaos_upstream() as chaos:
        config = gateway_config(chaos.base_url, state={"detach_grace": 0.5})
        with running_gateway(config) as gateway:
            with httpx2.stream(
                "POST", gateway.base_url + "/chat/completions", json=body
            ) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
                assert chaos.open_connections == 1
            left = time.monotonic()
            # Detached: the run goes on for the grace period, so a reconnect finds it live…
            time.sleep(0.3)
            assert chaos.open_connections == 1
            # …then the gateway hangs up on the upstream (which would go on for 40 s).
            deadline = left + 2.5
            while chaos.open_connections > 0:
                assert time.monotonic() < deadline, "the upstream stream was left open"
                time.sleep(0.02)
            assert gateway.metrics.detached_cancelled._value.get() == 1


def test_upstream_connections_are_kept_alive_between_streams() -> None:
    # The gateway reads each body to its end after [DONE], so the connection goes
    # back to the pool; a new TCP (and TLS) handshake per stream costs the client TTFT.
    with running_chaos_upstream() as upstream:
        with (
            running_gateway(gateway_config(upstream.base_url)) as gateway,
            OpenAI(base_url=gateway.base_url, api_key="sk-test", max_retries=0) as client,
        ):
            for seed in range(5):
                model = f"chaos:text=8,seed={seed}"
                assert stream_chat(client, model).text == expected_answer(model).text
                wait_until(lambda: upstream.open_connections == 1, "one upstream connection")


def test_non_stream_client_disconnect_cancels_the_run_and_closes_the_upstream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = "chaos:text=2000,pace_ms=20,seed=11"  # a 40 s answer
    labels = {"route": "*", "method": "POST", "status": "499"}
    with running_chaos_upstream() as chaos:  # its own: open_connections counts only ours
        with (
            running_gateway(gateway_config(chaos.base_url)) as gateway,
            OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0, timeout=0.5) as client,
            caplog.at_level(logging.INFO, logger="gateway.access"),
        ):
            with pytest.raises(openai.APITimeoutError):
                client.chat.completions.create(model=model, messages=MESSAGES)
            left = time.monotonic()
            assert len(chaos.requests_for(model)) == 1
            wait_until(lambda: chaos.open_connections == 0, "the upstream answer went on")
            assert time.monotonic() - left < 2  # not the 40 s the answer would take
            registry = gateway.metrics.registry
            wait_until(
                lambda: registry.get_sample_value("gateway_requests_total", labels) == 1,
                "the request counted as closed by the client",
            )
    [line] = [vars(r) for r in caplog.records if r.name == "gateway.access"]
    assert (line["status"], line["outcome"], line["client_closed"]) == (499, "cancelled", True)
