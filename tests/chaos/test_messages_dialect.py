"""``POST /v1/messages``: the chat answer in the Anthropic Messages API's events, faults and all."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import MessageParam

from gateway.chaos import ChaosUpstream, expected_answer, sampled_answer, thinking_signature
from gateway.chaos.answer import script_for
from gateway.chaos.messages import message_id
from gateway.chaos.spec import parse_spec
from gateway.recovery.classify import is_transient_error
from tests.chaos.helpers import Raw, first_deltas, json_document, read_raw

TEXT = expected_answer("chaos").text
USER: MessageParam = {"role": "user", "content": "Say something."}
CONTINUE = "Continue exactly where you left off."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sdk_client(upstream: ChaosUpstream) -> anthropic.AsyncAnthropic:
    """The anthropic SDK, whose base URL stops before ``/v1``."""
    base_url = upstream.base_url.removesuffix("/v1")
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="k", max_retries=0)


# --- reading a Messages stream as bytes ----------------------------------------------------


def post_stream(
    client: httpx2.Client, model: str, messages: list[Any] | None = None, **body: Any
) -> Raw:
    payload = {
        "model": model,
        "max_tokens": 1024,
        "messages": [USER] if messages is None else messages,
        "stream": True,
        **body,
    }
    return read_raw(client, "/messages", payload)


def post_json(
    client: httpx2.Client, model: str, messages: list[Any], **body: Any
) -> httpx2.Response:
    payload = {"model": model, "max_tokens": 1024, "messages": messages, **body}
    return client.post("/messages", json=payload)


@dataclass
class Assembled:
    """What a client makes of a Messages stream's events."""

    types: list[str] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)  # as content_block_start said
    text: str = ""
    text_deltas: list[str] = field(default_factory=list)
    thinking: str = ""
    signature: str | None = None
    calls: list[dict[str, str]] = field(default_factory=list)  # id, name, arguments
    content_deltas: int = 0
    message: dict[str, Any] | None = None  # message_start's
    stop_reason: str | None = None
    output_tokens: int | None = None
    stopped: bool = False
    errors: list[dict[str, Any]] = field(default_factory=list)


def assemble(objects: list[dict[str, Any]]) -> Assembled:
    out = Assembled()
    for event in objects:
        kind = event["type"]
        out.types.append(kind)
        if kind == "message_start":
            out.message = event["message"]
        elif kind == "content_block_start":
            block = event["content_block"]
            out.blocks.append(block)
            if block["type"] == "tool_use":
                out.calls.append({"id": block["id"], "name": block["name"], "arguments": ""})
        elif kind == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                out.text += delta["text"]
                out.text_deltas.append(delta["text"])
                out.content_deltas += 1
            elif delta["type"] == "thinking_delta":
                out.thinking += delta["thinking"]
                out.content_deltas += 1
            elif delta["type"] == "signature_delta":
                out.signature = delta["signature"]
            elif delta["type"] == "input_json_delta":
                out.calls[-1]["arguments"] += delta["partial_json"]
                out.content_deltas += bool(delta["partial_json"])
        elif kind == "message_delta":
            out.stop_reason = event["delta"]["stop_reason"]
            out.output_tokens = event["usage"]["output_tokens"]
        elif kind == "message_stop":
            out.stopped = True
        elif kind == "error":
            out.errors.append(event["error"])
    return out


def assert_well_formed(objects: list[dict[str, Any]]) -> None:
    """``message_start``, ``ping``, blocks one after the other with indices 0, 1, 2, … (each
    started, its deltas, stopped), then ``message_delta`` and ``message_stop``."""
    assert [obj["type"] for obj in objects[:2]] == ["message_start", "ping"]
    assert [obj["type"] for obj in objects[-2:]] == ["message_delta", "message_stop"]
    open_index: int | None = None
    started = 0
    for obj in objects[2:-2]:
        if obj["type"] == "content_block_start":
            assert open_index is None
            assert obj["index"] == started
            open_index, started = started, started + 1
        elif obj["type"] == "content_block_delta":
            assert obj["index"] == open_index
        else:
            assert obj["type"] == "content_block_stop"
            assert obj["index"] == open_index
            open_index = None
    assert open_index is None


def content_deltas(spec: str) -> int:
    script = script_for(parse_spec(spec))
    fragments = sum(len(fragments) for fragments in script.tool_fragments)
    return len(script.reasoning_deltas) + len(script.text_deltas) + fragments


def number_of(identity: str) -> int:
    return int(identity.removeprefix("msg_chaos_"))


def expected_content(spec: str, number: int, text: str | None = None) -> list[dict[str, Any]]:
    """The content blocks of response ``number`` to ``spec``, saying ``text`` (default: all)."""
    answer = expected_answer(spec)
    text = answer.text if text is None else text
    content: list[dict[str, Any]] = []
    if answer.reasoning:
        signature = thinking_signature(number, answer.reasoning)
        content.append({"type": "thinking", "thinking": answer.reasoning, "signature": signature})
    if text:
        content.append({"type": "text", "text": text})
    content += [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}
        for call in answer.tool_calls
    ]
    return content


def stop_reason_of(spec: str) -> str:
    return "tool_use" if expected_answer(spec).tool_calls else "end_turn"


def anthropic_error(response: httpx2.Response) -> dict[str, Any]:
    """The ``error`` of an Anthropic error body, after checking its shape."""
    document = response.json()
    assert document["type"] == "error"
    assert set(document["error"]) == {"type", "message"}
    error: dict[str, Any] = document["error"]
    return error


# --- the whole stream, through the anthropic SDK ------------------------------------------

SPECS = [
    "chaos",
    "chaos:text=4,reasoning=3,tools=2",
    "chaos:text=7,reasoning=3,tools=2,arg_deltas=3,seed=5",
    "chaos:text=0,tools=1",
    "chaos:text=0,reasoning=2",
    "chaos:text=0",
    "chaos:text=9,reasoning=2,tools=1,lineend=crlf,comments=1,split=7",
    "chaos:text=5,reasoning=1,lineend=cr,comments=1,pace_ms=1",
]


@pytest.mark.anyio
@pytest.mark.parametrize("spec", SPECS)
async def test_sdk_stream_says_the_expected_answer(upstream: ChaosUpstream, spec: str) -> None:
    async with sdk_client(upstream) as sdk:
        async with sdk.messages.stream(model=spec, max_tokens=1024, messages=[USER]) as stream:
            kinds = [event.type async for event in stream]
            message = await stream.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    number = number_of(message.id)
    assert message.model == spec
    assert [block.model_dump(exclude_none=True) for block in message.content] == (
        expected_content(spec, number)
    )
    assert message.stop_reason == stop_reason_of(spec)
    assert message.usage.input_tokens == 11
    assert message.usage.output_tokens == content_deltas(spec)


@pytest.mark.anyio
async def test_sdk_stream_with_thinking_and_tool_calls(upstream: ChaosUpstream) -> None:
    spec = "chaos:reasoning=3,tools=2"
    answer = expected_answer(spec)
    async with sdk_client(upstream) as sdk:
        async with sdk.messages.stream(model=spec, max_tokens=1024, messages=[USER]) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            message = await stream.get_final_message()
    assert text == answer.text
    thinking, said, *calls = message.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock)
    assert thinking.thinking == answer.reasoning
    assert thinking.signature == thinking_signature(number_of(message.id), answer.reasoning)
    assert isinstance(said, anthropic.types.TextBlock)
    assert said.text == answer.text
    assert all(isinstance(call, anthropic.types.ToolUseBlock) for call in calls)
    assert [(call.id, call.name, call.input) for call in calls] == [  # type: ignore[union-attr]
        (call.id, call.name, json.loads(call.arguments)) for call in answer.tool_calls
    ]
    assert message.stop_reason == "tool_use"


@pytest.mark.anyio
@pytest.mark.parametrize("spec", ["chaos", "chaos:text=6,reasoning=3,tools=2", "chaos:text=0"])
async def test_sdk_non_streaming(upstream: ChaosUpstream, spec: str) -> None:
    messages: list[MessageParam] = [USER, {"role": "assistant", "content": "ok"}, USER]
    async with sdk_client(upstream) as sdk:
        message = await sdk.messages.create(model=spec, max_tokens=1024, messages=messages)
    assert message.id.startswith("msg_chaos_")
    assert message.role == "assistant"
    content = [block.model_dump(exclude_none=True) for block in message.content]
    assert content == expected_content(spec, number_of(message.id))
    assert message.stop_reason == stop_reason_of(spec)
    assert message.stop_sequence is None
    assert message.usage.input_tokens == 13  # 10 + three messages
    assert message.usage.output_tokens == content_deltas(spec)


def test_non_streaming_document(client: httpx2.Client) -> None:
    spec = "chaos:text=3,reasoning=2,tools=1"
    document = json_document(post_json(client, spec, [USER]))
    number = number_of(document["id"])
    assert document == {
        "id": message_id(number),
        "type": "message",
        "role": "assistant",
        "model": spec,
        "content": expected_content(spec, number),
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": content_deltas(spec)},
    }


# --- the events, as bytes --------------------------------------------------------------------


def test_event_order_and_shapes(client: httpx2.Client) -> None:
    spec = "chaos:text=2,reasoning=1,tools=1,arg_deltas=2"
    received = post_stream(client, spec)
    assert received.status == 200 and received.error is None
    objects = received.objects()
    assert [obj["type"] for obj in objects] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",  # thinking
        "content_block_delta",  # signature
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",  # the empty one
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert_well_formed(objects)
    answer = expected_answer(spec)
    script = script_for(parse_spec(spec))
    start = objects[0]["message"]
    number = number_of(start["id"])
    signature = thinking_signature(number, answer.reasoning)
    assert start == {
        "id": f"msg_chaos_{number}",
        "type": "message",
        "role": "assistant",
        "model": spec,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 1},
    }
    [call] = answer.tool_calls
    assert [obj.get("content_block") for obj in objects if "content_block" in obj] == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": call.id, "name": call.name, "input": {}},
    ]
    deltas = [(obj["index"], obj["delta"]) for obj in objects if "delta" in obj and "index" in obj]
    assert deltas == [
        (0, {"type": "thinking_delta", "thinking": answer.reasoning}),
        (0, {"type": "signature_delta", "signature": signature}),
        *[(1, {"type": "text_delta", "text": delta}) for delta in script.text_deltas],
        (2, {"type": "input_json_delta", "partial_json": ""}),
        *[
            (2, {"type": "input_json_delta", "partial_json": fragment})
            for fragment in script.tool_fragments[0]
        ],
    ]
    assert objects[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    }
    # Byte-exact framing: Anthropic's ping, with its space; one blank line after each event.
    raw = received.raw
    assert raw.startswith(b'event: message_start\ndata: {"type":"message_start","message":{')
    assert b'\n\nevent: ping\ndata: {"type": "ping"}\n\nevent: content_block_start\n' in raw
    assert raw.endswith(b'\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert raw.count(b"\n\n") == len(objects)


@pytest.mark.parametrize("spec", SPECS)
def test_streams_are_well_formed(client: httpx2.Client, spec: str) -> None:
    received = post_stream(client, spec)
    objects = received.objects()
    assert_well_formed(objects)
    got = assemble(objects)
    answer = expected_answer(spec)
    kinds = (
        ["thinking"] * bool(answer.reasoning)
        + ["text"] * bool(answer.text)
        + ["tool_use"] * len(answer.tool_calls)
    )
    assert [block["type"] for block in got.blocks] == kinds
    assert (got.thinking, got.text) == (answer.reasoning, answer.text)
    assert [call["arguments"] for call in got.calls] == [c.arguments for c in answer.tool_calls]
    assert got.output_tokens == got.content_deltas == content_deltas(spec)
    assert got.stop_reason == stop_reason_of(spec)


def test_signature_differs_per_response(client: httpx2.Client) -> None:
    spec = "chaos:text=3,reasoning=2"
    first, second = (
        assemble(post_stream(client, spec).objects()),
        assemble(post_stream(client, spec).objects()),
    )
    assert first.message is not None and second.message is not None
    assert first.signature != second.signature
    for got in (first, second):
        number = number_of(got.message["id"]) if got.message else 0
        assert got.signature == thinking_signature(number, expected_answer(spec).reasoning)


def test_headers_are_recorded(client: httpx2.Client, upstream: ChaosUpstream) -> None:
    headers = {"x-api-key": "sk-ant-chaos", "anthropic-version": "2023-06-01"}
    body = {"model": "chaos:text=2", "max_tokens": 5, "messages": [USER]}
    assert client.post("/messages", json=body, headers=headers).status_code == 200
    [recorded] = upstream.requests_for("chaos:text=2")
    assert recorded.path == "/v1/messages"
    assert recorded.headers["x-api-key"] == "sk-ant-chaos"
    assert recorded.headers["anthropic-version"] == "2023-06-01"
    assert (recorded.attempt, recorded.prefix, recorded.echo) == (0, "", "")
    assert recorded.answered_text == expected_answer("chaos:text=2").text


# --- faults, as raw bytes ------------------------------------------------------------------


@pytest.mark.parametrize("at", [0, 1, 7, 20])
def test_reset_after_exactly_at_deltas(client: httpx2.Client, at: int) -> None:
    spec = f"chaos:fault=reset,at={at}"
    received = post_stream(client, spec)
    assert isinstance(received.error, httpx2.ReadError | httpx2.RemoteProtocolError)
    got = assemble(received.objects())
    assert got.text == first_deltas(spec, at)
    assert not got.stopped and got.stop_reason is None
    if at:
        assert got.types[-1] == "content_block_delta"
    else:  # nothing but the opening events
        assert got.types == ["message_start", "ping"]


def test_reset_without_at_fires_half_way(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:text=10,fault=reset")
    assert received.error is not None
    assert assemble(received.objects()).text == first_deltas("chaos:text=10", 5)


def test_close_is_an_incomplete_chunked_read(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:fault=close,at=4")
    assert isinstance(received.error, httpx2.RemoteProtocolError)
    assert "incomplete chunked read" in str(received.error)
    assert assemble(received.objects()).text == first_deltas("chaos", 4)


def test_stall_is_a_read_timeout(upstream: ChaosUpstream) -> None:
    timeout = httpx2.Timeout(10, read=0.3)
    with httpx2.Client(base_url=upstream.base_url, timeout=timeout) as client:
        started = time.monotonic()
        received = post_stream(client, "chaos:fault=stall,at=3")
    assert isinstance(received.error, httpx2.ReadTimeout)
    assert time.monotonic() - started < 5
    assert assemble(received.objects()).text == first_deltas("chaos", 3)


IN_BAND = [
    ("error", "overloaded_error", "Overloaded", True),
    ("error_fatal", "invalid_request_error", "Output blocked by content filtering policy", False),
    ("error_done", "api_error", "Internal server error", True),
    ("finish_error", "api_error", "Internal server error", True),
]


@pytest.mark.parametrize(("fault", "kind", "message", "transient"), IN_BAND)
def test_in_band_errors(
    client: httpx2.Client, fault: str, kind: str, message: str, transient: bool
) -> None:
    received = post_stream(client, f"chaos:fault={fault},at=5")
    assert received.error is None  # the body ends properly
    events = received.events()
    objects = received.objects()
    got = assemble(objects)
    assert got.text == first_deltas("chaos", 5)
    error_at = got.types.index("error")
    assert events[error_at][0] == "error"
    assert objects[error_at] == {"type": "error", "error": {"type": kind, "message": message}}
    assert is_transient_error(objects[error_at]["error"]) is transient
    assert got.types[error_at - 1] == "content_block_delta"
    assert "message_delta" not in got.types
    # Only error_done says message_stop after its error.
    after = got.types[error_at + 1 :]
    assert after == (["message_stop"] if fault == "error_done" else [])


def test_no_finish_ends_cleanly_without_message_delta_and_stop(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:fault=no_finish,at=6")
    assert received.error is None
    got = assemble(received.objects())
    assert got.text == first_deltas("chaos", 6)
    assert got.types[-1] == "content_block_delta"
    assert "message_delta" not in got.types and not got.stopped
    assert received.raw.endswith(b"}}\n\n")


def test_malformed_event_then_the_rest_of_the_stream(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:fault=malformed,at=2")
    assert received.error is None
    events = received.events()
    bad = [index for index, (_, data) in enumerate(events) if not data.endswith("}")]
    assert len(bad) == 1
    name, data = events[bad[0]]
    assert name == "content_block_delta"
    assert data == '{"type":"content_block_delta",'
    with pytest.raises(json.JSONDecodeError):
        json.loads(data)
    # message_start, ping, the text block's start, two deltas, then the bad one.
    assert bad[0] == 5
    objects = received.objects()
    assert [obj["type"] for obj in objects[3:5]] == ["content_block_delta"] * 2
    assert_well_formed(objects)
    got = assemble(objects)
    assert got.text == TEXT
    assert got.stopped


def test_at_counts_thinking_text_and_argument_fragments(client: httpx2.Client) -> None:
    spec = "chaos:reasoning=3,text=2,tools=1,arg_deltas=4,fault=close"
    answer = expected_answer(spec)
    got = assemble(post_stream(client, f"{spec},at=3").objects())
    assert got.thinking == answer.reasoning
    assert got.signature is None  # the cut comes right after the last thinking delta
    got = assemble(post_stream(client, f"{spec},at=4").objects())
    assert (got.thinking, got.text, got.calls) == (answer.reasoning, first_deltas(spec, 1), [])
    assert got.signature is not None
    got = assemble(post_stream(client, f"{spec},at=7").objects())
    assert got.content_deltas == 7
    assert got.text == answer.text
    fragments = script_for(parse_spec(spec)).tool_fragments[0]
    [call] = got.calls
    assert call["arguments"] == "".join(fragments[:2])
    assert call["id"] == answer.tool_calls[0].id


def test_times_faults_only_the_first_requests(client: httpx2.Client) -> None:
    spec = "chaos:text=6,fault=reset,at=2,times=1"
    assert post_stream(client, spec).error is not None
    clean = post_stream(client, spec)
    assert clean.error is None
    assert assemble(clean.objects()).text == expected_answer(spec).text


@pytest.mark.anyio
async def test_sdk_sees_error_events_and_a_reset(upstream: ChaosUpstream) -> None:
    async with sdk_client(upstream) as sdk:
        for fault, kind in [
            ("error", "overloaded_error"),
            ("error_fatal", "invalid_request_error"),
        ]:
            spec = f"chaos:fault={fault},at=2"
            with pytest.raises(anthropic.APIStatusError) as raised:
                async with sdk.messages.stream(model=spec, max_tokens=9, messages=[USER]) as s:
                    async for _ in s:
                        pass
            assert raised.value.type == kind
        with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)):
            spec = "chaos:text=40,fault=reset,at=10"
            async with sdk.messages.stream(model=spec, max_tokens=9, messages=[USER]) as stream:
                async for _ in stream:
                    pass


def test_non_streaming_faults(client: httpx2.Client) -> None:
    spec = "chaos:text=3"
    for fault in ("error", "error_fatal", "error_done", "no_finish", "malformed", "finish_error"):
        document = post_json(client, f"{spec},fault={fault}", [USER]).json()
        assert document["content"] == [{"type": "text", "text": expected_answer(spec).text}]
    with pytest.raises(httpx2.ReadError):
        post_json(client, "chaos:fault=reset", [USER])
    with pytest.raises(httpx2.RemoteProtocolError, match="without sending complete message body"):
        post_json(client, "chaos:fault=close", [USER])


def test_reset_before_any_byte(client: httpx2.Client) -> None:
    with pytest.raises((httpx2.ReadError, httpx2.RemoteProtocolError)):
        post_json(client, "chaos:fault=reset_before", [USER])


# --- error statuses, in Anthropic's shape ---------------------------------------------------

HTTP = [
    ("http_400", 400, "invalid_request_error"),
    ("http_400_context", 400, "invalid_request_error"),
    ("http_401", 401, "authentication_error"),
    ("http_404", 404, "not_found_error"),
    ("http_429", 429, "rate_limit_error"),
    ("http_429_retry", 429, "rate_limit_error"),
    ("http_500", 500, "api_error"),
    ("http_502", 502, "api_error"),
    ("http_503", 503, "api_error"),
    ("http_529", 529, "overloaded_error"),
]


@pytest.mark.parametrize(("fault", "status", "kind"), HTTP)
def test_http_faults_answer_anthropic_errors(
    client: httpx2.Client, fault: str, status: int, kind: str
) -> None:
    for stream_flag in (True, False):
        spec = f"chaos:fault={fault},retry_after=7"
        response = post_json(client, spec, [USER], stream=stream_flag)
        assert response.status_code == status
        error = anthropic_error(response)
        assert error["type"] == kind
        assert error["message"]
        assert response.headers.get("retry-after") == ("7" if fault == "http_429_retry" else None)


@pytest.mark.anyio
async def test_sdk_raises_on_529(upstream: ChaosUpstream) -> None:
    async with sdk_client(upstream) as sdk:
        with pytest.raises(anthropic.APIStatusError) as raised:
            await sdk.messages.create(model="chaos:fault=http_529", max_tokens=9, messages=[USER])
        assert isinstance(raised.value, anthropic.InternalServerError)
        assert raised.value.status_code == 529
        assert raised.value.type == "overloaded_error"
        with pytest.raises(anthropic.RateLimitError):
            await sdk.messages.create(model="chaos:fault=http_429", max_tokens=9, messages=[USER])


def test_bad_requests_answer_anthropic_errors(client: httpx2.Client) -> None:
    response = post_json(client, "chaos:fault=nope", [USER])
    assert response.status_code == 400
    error = anthropic_error(response)
    assert error["type"] == "invalid_request_error"
    assert "invalid chaos spec" in error["message"]
    response = client.post("/messages", content=b"{not json", headers={"content-type": "json"})
    assert response.status_code == 400
    assert anthropic_error(response)["type"] == "invalid_request_error"
    response = client.post("/messages", json=[1, 2])
    assert response.status_code == 400
    assert anthropic_error(response)["type"] == "invalid_request_error"
    response = client.get("/messages")
    assert response.status_code == 404
    assert anthropic_error(response)["type"] == "not_found_error"


# --- continuations ---------------------------------------------------------------------------


def _prompt_messages(prefix: str, anchor: str = "", blocks: bool = False) -> list[Any]:
    prompt = CONTINUE + (f" Repeat <<<{anchor}>>>" if anchor else "")
    content: Any = prefix
    if blocks:  # as the SDK echoes an answer back: its thinking block, then its text
        thinking = {
            "type": "thinking",
            "thinking": "hmm",
            "signature": thinking_signature(1, "hmm"),
        }
        content = [
            thinking,
            {"type": "text", "text": prefix[:3]},
            {"type": "text", "text": prefix[3:]},
        ]
    return [USER, {"role": "assistant", "content": content}, {"role": "user", "content": prompt}]


def _prefill(prefix: str, blocks: bool = False) -> list[Any]:
    content: Any = prefix
    if blocks:
        thinking = {
            "type": "thinking",
            "thinking": "hmm",
            "signature": thinking_signature(1, "hmm"),
        }
        content = [thinking, {"type": "text", "text": prefix}]
    return [USER, {"role": "assistant", "content": content}]


def _cuts() -> list[int]:
    """Prefix lengths a prefill can have (no trailing whitespace): inside a delta, on a
    boundary, before a space (the "Hello," of "Hello, world"), inside a ZWJ sequence."""
    starts = script_for(parse_spec("chaos")).starts
    zwj = TEXT.index("👩\u200d💻")
    before_space = next(i for i in range(2, len(TEXT)) if TEXT[i] == " " and TEXT[i - 1] != " ")
    cjk = TEXT.index("你好")
    cuts = [1, starts[5], starts[5] + 1, starts[6] + 2, before_space, zwj + 1, cjk + 1]
    cuts.append(len(TEXT) - 1)
    return [cut for cut in cuts if not TEXT[cut - 1].isspace()]


def _recorded(upstream: ChaosUpstream, model: str) -> tuple[str | None, str | None, str | None]:
    recorded = upstream.requests_for(model)[-1]
    assert recorded.path == "/v1/messages"
    return recorded.prefix, recorded.echo, recorded.answered_text


@pytest.mark.parametrize("cut", _cuts())
@pytest.mark.parametrize("blocks", [False, True])
def test_prompt_mode_resumes_at_the_offset(
    client: httpx2.Client, upstream: ChaosUpstream, cut: int, blocks: bool
) -> None:
    prefix = TEXT[:cut]
    got = assemble(post_stream(client, "chaos", _prompt_messages(prefix, blocks=blocks)).objects())
    assert got.text == TEXT[cut:]
    assert _recorded(upstream, "chaos") == (prefix, "", TEXT[cut:])


def test_prompt_mode_with_an_anchor_repeats_it_then_resumes_mid_delta(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    script = script_for(parse_spec("chaos"))
    cut = script.starts[4] + 2
    prefix = TEXT[:cut]
    anchor = prefix[-6:]
    got = assemble(post_stream(client, "chaos", _prompt_messages(prefix, anchor)).objects())
    assert got.text_deltas == [anchor, script.text_deltas[4][2:], *script.text_deltas[5:]]
    assert _recorded(upstream, "chaos") == (prefix, anchor, TEXT[cut:])
    # anchor=0 plays a model that does not repeat it.
    spec = "chaos:anchor=0"
    got = assemble(post_stream(client, spec, _prompt_messages(prefix, anchor)).objects())
    assert got.text == TEXT[cut:]


@pytest.mark.parametrize("cut", _cuts())
@pytest.mark.parametrize("blocks", [False, True])
def test_prefill_resumes_at_the_offset(
    client: httpx2.Client, upstream: ChaosUpstream, cut: int, blocks: bool
) -> None:
    prefix = TEXT[:cut]
    received = post_stream(client, "chaos", _prefill(prefix, blocks))
    objects = received.objects()
    assert_well_formed(objects)
    got = assemble(objects)
    assert got.text == TEXT[cut:]
    assert _recorded(upstream, "chaos") == (prefix, "", TEXT[cut:])
    assert got.message is not None
    assert got.message["usage"]["input_tokens"] == 12


def test_prefill_before_a_space_continues_with_it(client: httpx2.Client) -> None:
    # The gateway strips the prefill's trailing whitespace: "Hello," goes on with " world".
    cut = next(i for i in range(2, len(TEXT)) if TEXT[i] == " " and TEXT[i - 1] != " ")
    got = assemble(post_stream(client, "chaos", _prefill(TEXT[:cut])).objects())
    assert got.text_deltas[0].startswith(" ")
    assert got.text == TEXT[cut:]


@pytest.mark.anyio
async def test_sdk_prefill_continuation(upstream: ChaosUpstream) -> None:
    spec = "chaos:text=10,reasoning=2,tools=1"
    answer = expected_answer(spec)
    prefix = answer.text[: len(answer.text) // 2].rstrip()
    messages: list[MessageParam] = [USER, {"role": "assistant", "content": prefix}]
    async with sdk_client(upstream) as sdk:
        message = await sdk.messages.create(model=spec, max_tokens=99, messages=messages)
        async with sdk.messages.stream(model=spec, max_tokens=99, messages=messages) as stream:
            streamed = await stream.get_final_message()
    rest = answer.text[len(prefix) :]
    for got in (message, streamed):
        content = [block.model_dump(exclude_none=True) for block in got.content]
        assert content == expected_content(spec, number_of(got.id), rest)
    assert _recorded(upstream, spec) == (prefix, "", rest)


def test_prefill_echo(client: httpx2.Client, upstream: ChaosUpstream) -> None:
    got = assemble(post_stream(client, "chaos:echo=4", _prefill(TEXT[:20])).objects())
    assert got.text == TEXT[16:]
    assert _recorded(upstream, "chaos:echo=4") == (TEXT[:20], TEXT[16:20], TEXT[20:])


def test_continuation_thinks_anew_and_sends_tool_calls_whole(client: httpx2.Client) -> None:
    spec = "chaos:text=10,reasoning=3,tools=2"
    answer = expected_answer(spec)
    fresh = assemble(post_stream(client, spec).objects())
    prefix = answer.text[: len(answer.text) // 2].rstrip()
    for messages in (_prefill(prefix), _prompt_messages(prefix)):
        got = assemble(post_stream(client, spec, messages).objects())
        assert got.message is not None and fresh.message is not None
        assert got.message["id"] != fresh.message["id"]
        assert got.thinking == answer.reasoning
        number = number_of(got.message["id"])
        assert got.signature == thinking_signature(number, answer.reasoning) != fresh.signature
        assert got.text == answer.text[len(prefix) :]
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in answer.tool_calls]
        assert got.calls == calls
        assert [block["type"] for block in got.blocks] == [
            "thinking",
            "text",
            "tool_use",
            "tool_use",
        ]


def test_whole_text_prefix_leaves_no_text_block(client: httpx2.Client) -> None:
    spec = "chaos:text=6,tools=1"
    answer = expected_answer(spec)
    got = assemble(post_stream(client, spec, _prompt_messages(answer.text)).objects())
    assert got.text == ""
    assert [block["type"] for block in got.blocks] == ["tool_use"]
    assert got.calls[0]["arguments"] == answer.tool_calls[0].arguments
    assert got.stop_reason == "tool_use"


def test_a_prefix_that_is_not_of_the_answer_gets_the_whole_answer(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    for messages in (_prefill("Something else"), _prompt_messages("Something else")):
        assert assemble(post_stream(client, "chaos", messages).objects()).text == TEXT
        assert _recorded(upstream, "chaos") == ("", "", TEXT)


def test_chat_still_needs_a_flag_for_a_prefill(client: httpx2.Client) -> None:
    body = {"model": "chaos", "messages": [USER, {"role": "assistant", "content": TEXT[:10]}]}
    document = client.post("/chat/completions", json=body).json()
    assert document["choices"][0]["message"]["content"] == TEXT


@pytest.mark.parametrize("tail", [" ", "\n", "\t  "])
def test_prefill_with_trailing_whitespace_is_refused(
    client: httpx2.Client, upstream: ChaosUpstream, tail: str
) -> None:
    for stream_flag in (True, False):
        response = post_json(client, "chaos", _prefill(TEXT[:10] + tail), stream=stream_flag)
        assert response.status_code == 400
        assert anthropic_error(response) == {
            "type": "invalid_request_error",
            "message": "final assistant content cannot end with trailing whitespace",
        }
    assert [recorded.attempt for recorded in upstream.requests_for("chaos")] == [None, None]
    blocks = _prefill(TEXT[:10] + tail, blocks=True)
    assert post_json(client, "chaos", blocks).status_code == 400


@pytest.mark.anyio
async def test_sdk_sees_the_trailing_whitespace_refusal(upstream: ChaosUpstream) -> None:
    messages: list[MessageParam] = [USER, {"role": "assistant", "content": "Hello, "}]
    async with sdk_client(upstream) as sdk:
        with pytest.raises(anthropic.BadRequestError) as raised:
            await sdk.messages.create(model="chaos", max_tokens=9, messages=messages)
    assert raised.value.type == "invalid_request_error"
    assert "trailing whitespace" in str(raised.value.api_message)


def test_prefill_0_refuses_a_trailing_assistant_message(client: httpx2.Client) -> None:
    for stream_flag in (True, False):
        response = post_json(client, "chaos:prefill=0", _prefill(TEXT[:10]), stream=stream_flag)
        assert response.status_code == 400
        error = anthropic_error(response)
        assert error["type"] == "invalid_request_error"
        assert "does not support assistant message prefill" in error["message"]
    # A prompt-mode continuation still works.
    got = assemble(post_stream(client, "chaos:prefill=0", _prompt_messages(TEXT[:10])).objects())
    assert got.text == TEXT[10:]


# --- rechunk=1, sample=1 ---------------------------------------------------------------------


def test_rechunk_splits_the_same_text_anew(client: httpx2.Client, upstream: ChaosUpstream) -> None:
    spec = "chaos:text=30,rechunk=1"
    answer = expected_answer(spec)
    first = assemble(post_stream(client, spec).objects())
    second = assemble(post_stream(client, spec).objects())
    assert first.text == second.text == answer.text
    assert first.text_deltas != second.text_deltas
    prefix = answer.text[:41].rstrip()
    third = assemble(post_stream(client, spec, _prefill(prefix)).objects())
    assert third.text == answer.text[len(prefix) :]
    recorded = upstream.requests_for(spec)
    assert [r.attempt for r in recorded] == [0, 1, 2]
    assert (recorded[2].prefix, recorded[2].answered_text) == (prefix, third.text)
    assert third.output_tokens == len(third.text_deltas)


def test_sample_says_other_text_on_every_request(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    spec = "chaos:text=12,sample=1"
    first = assemble(post_stream(client, spec).objects())
    assert first.text == sampled_answer(spec, 0)
    prefix = "Once upon a time"  # any prefix is continued
    second = assemble(post_stream(client, spec, _prefill(prefix)).objects())
    assert second.text == sampled_answer(spec, 1, prefix)
    assert second.text != first.text
    recorded = upstream.requests_for(spec)
    assert [(r.attempt, r.prefix, r.answered_text) for r in recorded] == [
        (0, "", first.text),
        (1, prefix, second.text),
    ]
    document = post_json(client, spec, _prompt_messages(prefix)).json()
    assert document["content"] == [{"type": "text", "text": sampled_answer(spec, 2, prefix)}]


# --- the next turn: what Anthropic checks of what comes back ---------------------------------


def test_the_next_turn_with_tool_results_is_answered_in_text(client: httpx2.Client) -> None:
    spec = "chaos:text=4,reasoning=2,tools=1"
    first = post_json(client, spec, [USER]).json()
    (call,) = [block for block in first["content"] if block["type"] == "tool_use"]
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "42"}
    turn = [USER, {"role": "assistant", "content": first["content"]}]
    turn.append({"role": "user", "content": [result]})
    again = post_json(client, spec, turn)
    assert again.status_code == 200, again.text
    # Not a continuation of the first turn's text: a new answer, the tools' loop ended.
    answer = again.json()
    assert [block["type"] for block in answer["content"]] == ["thinking", "text"]
    assert answer["stop_reason"] == "end_turn"


@pytest.mark.parametrize("change", ["truncated", "unsigned", "forged"])
def test_a_thinking_block_that_cannot_be_verified_is_refused(
    client: httpx2.Client, change: str
) -> None:
    first = post_json(client, "chaos:text=4,reasoning=3", [USER]).json()
    thinking = first["content"][0]
    assert thinking["type"] == "thinking"
    if change == "truncated":  # as a block cut mid-stream would be
        thinking["thinking"] = thinking["thinking"][:-2]
    elif change == "unsigned":
        thinking["signature"] = ""
    else:
        thinking["signature"] = "sig_1_0000"
    turn = [USER, {"role": "assistant", "content": first["content"]}, USER]
    refused = post_json(client, "chaos:text=2", turn)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "messages.1.content.0: Invalid `signature` in `thinking` block"
    )
