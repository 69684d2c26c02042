"""The Anthropic Messages API end to end: real sockets, the chaos upstream, the anthropic SDK.

``client.messages.stream()`` accumulates the events into the final message and
checks their order as it goes; beside it, the raw events are checked for the
section 2a contract: one ``message_start``, block indices 0, 1, 2… each started
and stopped once, one ``message_delta``, ``message_stop`` last — or ``event: error``
and no ``message_stop``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic.types import MessageParam

from gateway.chaos import ChaosUpstream, expected_answer, running_chaos_upstream
from gateway.chaos.answer import attempt_deltas
from gateway.chaos.messages import thinking_signature
from gateway.chaos.spec import parse_spec
from gateway.config.load import parse_config
from gateway.protocols.messages_splice import PING
from tests.api.streams import first_raw_events
from tests.protocols.named import events as named_events
from tests.servers import RunningGateway, recovering_config, running_gateway

FAULTS = [
    "reset",
    "close",
    "stall",
    "error",
    "error_done",
    "no_finish",
    "finish_error",
    "malformed",
]
ASK: list[MessageParam] = [{"role": "user", "content": "Tell me."}]


def config(chaos: ChaosUpstream, **overrides: Any) -> Any:
    upstream = {"kind": "anthropic"} | overrides.pop("upstream", {})
    # The anthropic SDK's base URL: the chaos server's root, without /v1.
    root = chaos.base_url.removesuffix("/v1")
    return recovering_config(root, upstream=upstream, **overrides)


@pytest.fixture(scope="module")
def recovering(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(config(chaos)) as running:
        yield running


@pytest.fixture
def sdk(recovering: RunningGateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=recovering.url, api_key="k", max_retries=0) as client:
        yield client


def raw_events(gateway: RunningGateway, body: dict[str, Any], **headers: str) -> list[Any]:
    """The client's events as (type, data), each frame checked: ``event:`` names its type."""
    body = {"max_tokens": 1024, "messages": ASK, "stream": True} | body
    headers = {"x-api-key": "k"} | headers
    with httpx2.Client(base_url=gateway.url, timeout=15) as http:
        raw = http.post("/v1/messages", json=body, headers=headers).content
    return parse(raw)


def parse(raw: bytes) -> list[dict[str, Any]]:
    """The client's events, but the gateway's pings (not part of the run)."""
    return [event for event in named_events(raw) if event["type"] != "ping"]


def check_contract(events: list[dict[str, Any]]) -> None:
    """Section 2a, Messages, for a stream that ended well."""
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types.count("message_start") == 1
    started = [e["index"] for e in events if e["type"] == "content_block_start"]
    stopped = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert started == list(range(len(started)))
    assert stopped == started
    open_block = None
    for event in events:  # every delta inside its block, blocks one after another
        if event["type"] == "content_block_start":
            assert open_block is None
            open_block = event["index"]
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_block
        elif event["type"] == "content_block_stop":
            open_block = None
    assert types.count("message_delta") == 1 and types[-2:] == ["message_delta", "message_stop"]
    assert "error" not in types


def text(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["delta"]["text"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )


def final(sdk: anthropic.Anthropic, model: str, **extra: Any) -> Any:
    """The message the SDK's stream helper accumulated (it checks the event order)."""
    with sdk.messages.stream(model=model, max_tokens=1024, messages=ASK, **extra) as stream:
        for _ in stream:
            pass
        return stream.get_final_message()


def blocks(message: Any, kind: str) -> list[Any]:
    return [block for block in message.content if block.type == kind]


def calls_of(model: str, count: int | None = None) -> list[tuple[str, str, Any]]:
    calls = [(c.id, c.name, orjson.loads(c.arguments)) for c in expected_answer(model).tool_calls]
    return calls[:count] if count is not None else calls


def tool_uses(message: Any) -> list[tuple[str, str, Any]]:
    return [(b.id, b.name, b.input) for b in blocks(message, "tool_use")]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("at", [0, 9, 30], ids=["before-content", "mid-text", "after-last"])
def test_text_survives_every_fault_at_every_point(
    recovering: RunningGateway, sdk: anthropic.Anthropic, fault: str, at: int
) -> None:
    model = f"chaos:text=30,seed=50,fault={fault},at={at},times=1"
    expected = expected_answer(model).text
    message = final(sdk, model)
    assert [b.text for b in blocks(message, "text")] == [expected]
    assert message.stop_reason == "end_turn"
    events = raw_events(recovering, {"model": model.replace("seed=50", "seed=51")})
    check_contract(events)
    assert text(events) == expected_answer(model.replace("seed=50", "seed=51")).text


@pytest.mark.parametrize("fault", ["reset", "error", "no_finish"])
@pytest.mark.parametrize(
    ("at", "calls"),
    [
        (0, 2),  # nothing sent: whole restart
        (4, 2),  # mid-text: continue, then both calls
        (6, 2),  # after the last text delta, before its stop: the text block is open
        (8, 2),  # text + half of call 0: drop it, continue, both calls
        (10, 2),  # call 0's every fragment, not its stop: not whole, so dropped
        (11, 1),  # call 0 stopped, call 1 begun: finish with call 0, no upstream call
        (14, 1),  # after call 1's last fragment, before its stop: it is not whole
    ],
    ids=[
        "before-content",
        "mid-text",
        "text-unstopped",
        "mid-arguments",
        "no-stop",
        "between-calls",
        "last",
    ],
)
def test_tool_uses_survive_every_fault_at_every_point(
    recovering: RunningGateway, sdk: anthropic.Anthropic, fault: str, at: int, calls: int
) -> None:
    model = f"chaos:text=6,tools=2,arg_deltas=4,seed=52,fault={fault},at={at},times=1"
    message = final(sdk, model)
    assert "".join(b.text for b in blocks(message, "text")) == expected_answer(model).text
    assert tool_uses(message) == calls_of(model, calls)
    assert message.stop_reason == "tool_use"
    other = model.replace("seed=52", "seed=53")
    events = raw_events(recovering, {"model": other})
    check_contract(events)
    # Each tool_use block whole: its input_json_deltas join into its expected input.
    starts = {e["index"]: e["content_block"] for e in events if e["type"] == "content_block_start"}
    inputs: dict[int, str] = {}
    for event in events:
        if event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            assert starts[event["index"]]["type"] == "tool_use"
            inputs[event["index"]] = inputs.get(event["index"], "") + event["delta"]["partial_json"]
    received = [(starts[i]["id"], starts[i]["name"], orjson.loads(j)) for i, j in inputs.items()]
    assert received == calls_of(other, calls)


@pytest.mark.parametrize("at", [3, 8], ids=["mid-thinking", "mid-text"])
def test_thinking_is_whole_signed_and_never_sent_twice(
    recovering: RunningGateway, sdk: anthropic.Anthropic, at: int
) -> None:
    model = f"chaos:text=20,reasoning=6,seed=54,fault=reset,at={at},times=1"
    answer = expected_answer(model)
    message = final(sdk, model)
    (thinking,) = blocks(message, "thinking")
    assert thinking.thinking == answer.reasoning  # whole: a cut one is never shown
    number, digest = thinking.signature.split("_")[1:]
    assert thinking.signature == thinking_signature(int(number), answer.reasoning)
    assert "".join(b.text for b in blocks(message, "text")) == answer.text
    events = raw_events(recovering, {"model": model.replace("seed=54", "seed=55")})
    check_contract(events)
    kinds = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert kinds == ["thinking", "text"]


def test_a_continuation_with_thinking_on_is_prompted_and_carries_the_signed_thinking(
    chaos: ChaosUpstream, sdk: anthropic.Anthropic
) -> None:
    model = "chaos:text=20,reasoning=4,seed=56,fault=reset,at=9,times=1"
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = final(sdk, model, thinking=thinking)
    answer = expected_answer(model)
    assert "".join(b.text for b in blocks(message, "text")) == answer.text
    original, continuation = chaos.requests_for(model)
    *_, assistant, user = continuation.body["messages"]
    assert user["role"] == "user" and "<<<" in user["content"]  # prompt mode, not prefill
    signed, prefix = assistant["content"]
    assert signed["type"] == "thinking" and signed["signature"] == message.content[0].signature
    assert prefix["type"] == "text" and answer.text.startswith(prefix["text"]) and prefix["text"]


def test_a_prefill_continuation_cuts_the_whitespace_it_could_not_send(
    recovering: RunningGateway, chaos: ChaosUpstream
) -> None:
    """Anthropic refuses a prefill that ends in whitespace: the gateway sends it without,
    and the reply, which begins with that whitespace again, is cut exactly there."""
    stripped = 0
    for at in range(4, 30):
        model = f"chaos:text=30,seed=57,rechunk=1,fault=reset,at={at},times=1"
        events = raw_events(recovering, {"model": model})
        check_contract(events)
        assert text(events) == expected_answer(model).text, at
        # What the client had when the first response broke: its first ``at`` deltas.
        had = "".join((attempt_deltas(parse_spec(model), 0, "") or ())[:at])
        continuation = chaos.requests_for(model)[-1]
        assert continuation.body["messages"][-1] == {"role": "assistant", "content": had.rstrip()}
        stripped += had != had.rstrip()
    assert stripped  # some cuts came right after whitespace


def test_a_model_that_refuses_prefill_is_continued_in_prompt_mode(
    recovering: RunningGateway, chaos: ChaosUpstream, sdk: anthropic.Anthropic
) -> None:
    model = "chaos:text=30,seed=58,prefill=0,fault=reset,at=12,times=1"
    refused = recovering.metrics.prefill_refusals.labels("chaos", "prefill")._value.get()
    message = final(sdk, model)
    assert message.content[0].text == expected_answer(model).text
    original, prefill, prompt = chaos.requests_for(model)
    assert prefill.attempt is None  # refused with a 400 before it counted as an attempt
    assert prompt.body["messages"][-1]["role"] == "user"
    assert recovering.metrics.prefill_refusals.labels("chaos", "prefill")._value.get() == (
        refused + 1
    )


def test_utf8_split_across_reads_and_a_seam(sdk: anthropic.Anthropic) -> None:
    model = "chaos:text=40,seed=59,split=3,fault=reset,at=17,times=1"
    assert final(sdk, model).content[0].text == expected_answer(model).text


def test_non_streaming_is_recovered(sdk: anthropic.Anthropic) -> None:
    model = "chaos:text=30,tools=1,reasoning=3,seed=60,fault=reset,at=12,times=1"
    message: Any = sdk.messages.create(model=model, max_tokens=1024, messages=ASK)
    answer = expected_answer(model)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[1].text == answer.text
    assert message.content[0].thinking == answer.reasoning and message.content[0].signature
    assert tool_uses(message) == calls_of(model)
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_usage_is_summed_over_legs(recovering: RunningGateway) -> None:
    model = "chaos:text=20,seed=61,fault=reset,at=8,times=1"
    events = raw_events(recovering, {"model": model})
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    # Each leg pays for its prompt (10 + its messages: 1, then 2 with the prefill), as
    # each reported in its message_start. Output: the second leg's 12 text deltas (the
    # 20 less the 8 the client had), as it reported; the broken leg's, which reported
    # only message_start's 1, estimated from its 8 deltas at the second leg's tokens
    # per delta (gateway/recovery/usage.py): the fault-free answer's 20 in all.
    assert delta["usage"]["input_tokens"] == 11 + 12
    assert delta["usage"]["output_tokens"] == 8 + 12


def test_an_answer_that_cannot_be_completed_ends_with_an_error_and_no_stop(
    recovering: RunningGateway, sdk: anthropic.Anthropic
) -> None:
    model = "chaos:text=30,seed=62,fault=reset,at=10"  # every attempt breaks
    events = raw_events(recovering, {"model": model})
    assert events[-1]["type"] == "error" and "message_stop" not in [e["type"] for e in events]
    assert events[-1]["error"]["type"] == "api_error"
    assert "incomplete" in events[-1]["error"]["message"]
    started = [e["index"] for e in events if e["type"] == "content_block_start"]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == started
    with pytest.raises(anthropic.APIStatusError) as raised:
        final(sdk, model)
    assert "incomplete" in str(raised.value)


def test_a_fatal_in_band_error_is_surfaced_at_once(
    recovering: RunningGateway, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=30,seed=63,fault=error_fatal,at=10"
    events = raw_events(recovering, {"model": model})
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["type"] == "invalid_request_error"
    assert "content filtering" in events[-1]["error"]["message"]
    assert len(chaos.requests_for(model)) == 1  # a refusal is not retried


def test_overloaded_before_the_stream_is_retried(sdk: anthropic.Anthropic) -> None:
    model = "chaos:text=10,seed=64,fault=http_529,times=2"
    assert final(sdk, model).content[0].text == expected_answer(model).text


def test_overloaded_on_every_attempt_is_passed_through_not_to_be_retried(
    recovering: RunningGateway,
) -> None:
    with anthropic.Anthropic(base_url=recovering.url, api_key="k", max_retries=0) as client:
        with pytest.raises(anthropic.InternalServerError) as raised:
            client.messages.create(model="chaos:fault=http_529", max_tokens=5, messages=ASK)
    assert raised.value.status_code == 529
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert raised.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_gateway_errors_are_anthropic_shaped(recovering: RunningGateway) -> None:
    with httpx2.Client(base_url=recovering.url, timeout=5) as http:
        bad_json = http.post("/v1/messages", content=b"{nope", headers={"x-api-key": "k"})
        no_model = http.post("/v1/messages", json={"messages": ASK}, headers={"x-api-key": "k"})
    assert bad_json.status_code == 400
    assert bad_json.json()["type"] == "error"
    assert bad_json.json()["error"]["type"] == "invalid_request_error"
    assert no_model.status_code == 404
    assert no_model.json()["error"]["type"] == "not_found_error"
    assert "model" in no_model.json()["error"]["message"]


def test_recovery_waits_send_ping_events(chaos: ChaosUpstream) -> None:
    slow = {"backoff_initial": 0.8, "backoff_max": 0.8}
    settings = config(chaos, route={"retry": slow}, state={"keepalive_interval": 0.1})
    with running_gateway(settings) as gateway:
        body = {"model": "chaos:text=20,seed=65,fault=reset,at=6,times=1", "max_tokens": 10,
                "messages": ASK, "stream": True}  # fmt: skip
        with httpx2.Client(base_url=gateway.url, timeout=15) as http:
            raw = http.post("/v1/messages", json=body, headers={"x-api-key": "k"}).content
    assert PING in raw  # the protocol's own keepalive, never a comment
    assert b"\n: keepalive" not in raw and not raw.startswith(b":")
    check_contract(parse(raw))


def test_gateway_keys_are_accepted_as_x_api_key(chaos: ChaosUpstream) -> None:
    with running_gateway(config(chaos, auth={"keys": ["gw-key-123456"]})) as gateway:
        body = {"model": "chaos:text=3", "max_tokens": 5, "messages": ASK}
        with httpx2.Client(base_url=gateway.url, timeout=5) as http:
            good = http.post("/v1/messages", json=body, headers={"x-api-key": "gw-key-123456"})
            bad = http.post("/v1/messages", json=body, headers={"x-api-key": "nope"})
        # The SDK sends its key as a bearer token: accepted too.
        with anthropic.Anthropic(base_url=gateway.url, api_key="gw-key-123456") as client:
            message: Any = client.messages.create(model="chaos:text=3", max_tokens=5, messages=ASK)
    assert good.status_code == 200 and good.json()["content"][0]["text"]
    assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
    assert message.content[0].text == expected_answer("chaos:text=3").text
    # The gateway's key is its own: never sent upstream.
    assert all(r.headers.get("x-api-key") != "gw-key-123456" for r in chaos.requests)


def test_resume_by_run_id_gives_exactly_the_rest(recovering: RunningGateway) -> None:
    model = "chaos:text=40,seed=66,pace_ms=20"
    body = {"model": model, "max_tokens": 1024, "messages": ASK, "stream": True}
    with httpx2.Client(base_url=recovering.url, timeout=15) as http:
        key = {"x-api-key": "k"}
        run_id, head, read = first_raw_events(http, "/v1/messages", body, key, 8)
        headers = key | {"x-run-id": run_id, "x-resume-from": str(read)}
        rest = http.post("/v1/messages", json=body, headers=headers).content
        stranger = http.post("/v1/messages", json=body, headers=headers | {"x-api-key": "other"})
    events = parse(head + rest)
    check_contract(events)
    assert text(events) == expected_answer(model).text
    assert stranger.status_code == 404 and stranger.json()["type"] == "error"


def test_a_refused_prefill_never_masks_the_failure(
    recovering: RunningGateway, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=30,seed=67,prefill=0,fault=reset,at=10"  # every attempt breaks
    events = raw_events(recovering, {"model": model})
    error = events[-1]
    assert error["type"] == "error"
    assert "reset the connection mid-stream" in error["error"]["message"]
    assert "prefill" not in error["error"]["message"]
    requests = chaos.requests_for(model)
    assert any(r.attempt is None for r in requests)  # the prefill refused with a 400
    assert requests[-1].body["messages"][-1]["role"] == "user"  # then prompt mode


def test_create_stream_true_through_the_sdk_keeps_the_contract(sdk: anthropic.Anthropic) -> None:
    model = "chaos:text=25,reasoning=3,tools=1,seed=68,fault=error,at=11,times=1"
    with sdk.messages.create(model=model, max_tokens=1024, messages=ASK, stream=True) as stream:
        events: list[dict[str, Any]] = [event.to_dict(mode="json") for event in stream]
    check_contract(events)
    assert text(events) == expected_answer(model).text
    kinds = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert kinds == ["thinking", "text", "tool_use"]


def test_an_anthropic_clients_other_requests_never_reach_the_openai_upstream(
    chaos: ChaosUpstream,
) -> None:
    """With an OpenAI and an Anthropic upstream (as the embedded defaults have them), a
    request of the anthropic SDK that names no model, or is not a message, still goes
    to the Anthropic one: its key must never reach OpenAI."""
    with running_chaos_upstream() as openai_side:
        settings = parse_config(
            {
                "upstreams": [
                    {"name": "openai", "base_url": openai_side.base_url},
                    {"name": "claude", "kind": "anthropic", "base_url": chaos.base_url},
                ],
                "routes": [
                    {"match": "*", "upstream": "claude"},
                    {"match": "*", "upstream": "openai"},
                ],
            }
        )
        chaos.requests.clear()
        with running_gateway(settings) as gateway:
            key = {"x-api-key": "sk-ant-secret", "anthropic-version": "2023-06-01"}
            with httpx2.Client(base_url=gateway.url, timeout=5) as http:
                models = http.get("/v1/models", headers=key)
                http.post("/v1/messages/count_tokens", json={"model": "m", "messages": ASK},
                          headers=key)  # fmt: skip
                http.get("/v1/models", headers={"authorization": "Bearer sk-openai"})
        assert models.status_code == 200
        assert [r.path for r in chaos.requests] == ["/v1/models", "/v1/messages/count_tokens"]
        assert all(r.headers["x-api-key"] == "sk-ant-secret" for r in chaos.requests)
        assert [r.path for r in openai_side.requests] == ["/v1/models"]
        assert "x-api-key" not in openai_side.requests[0].headers


def test_the_clients_query_string_goes_with_every_leg(
    sdk: anthropic.Anthropic, chaos: ChaosUpstream
) -> None:
    """Claude Code calls ``/v1/messages?beta=true``: the first leg and the continuation
    go to the same URL."""
    model = "chaos:text=20,seed=63,fault=reset,at=8,times=1"
    chaos.requests.clear()
    beta = {"beta": "true"}
    with sdk.messages.stream(
        model=model, max_tokens=1024, messages=ASK, extra_query=beta
    ) as stream:
        for _ in stream:
            pass
        message = stream.get_final_message()
    assert "".join(b.text for b in message.content if b.type == "text") == (
        expected_answer(model).text
    )
    legs = [r for r in chaos.requests if r.path == "/v1/messages"]
    assert [r.query for r in legs] == ["beta=true", "beta=true"]
