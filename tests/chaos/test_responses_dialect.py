"""``POST /v1/responses``: the chat answer in the Responses API's events, faults and all."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import httpx2
import openai
import pytest

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.chaos.answer import script_for
from gateway.chaos.spec import parse_spec
from gateway.recovery.classify import is_transient_error
from tests.chaos.helpers import Raw, first_deltas, json_document, read_raw

TEXT = expected_answer("chaos").text
USER = {"role": "user", "content": "Say something."}
CONTINUE = "Continue exactly where you left off."


@pytest.fixture
def sdk(upstream: ChaosUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=upstream.base_url, api_key="chaos", max_retries=0) as client:
        yield client


# --- reading a Responses stream as bytes -------------------------------------------------


def post_stream(client: httpx2.Client, model: str, **body: Any) -> Raw:
    payload = {"model": model, "input": [USER], "stream": True, **body}
    return read_raw(client, "/responses", payload)


@dataclass
class Assembled:
    """What a client makes of a Responses stream's events."""

    types: list[str] = field(default_factory=list)
    text: str = ""
    text_deltas: list[str] = field(default_factory=list)
    reasoning: str = ""
    content_deltas: int = 0
    calls: dict[str, dict[str, str]] = field(default_factory=dict)  # by item id
    item_ids: list[str] = field(default_factory=list)
    final: dict[str, Any] | None = None


def assemble(objects: list[Any]) -> Assembled:
    out = Assembled()
    for obj in objects:
        event = obj if isinstance(obj, dict) else obj.model_dump()
        kind = event["type"]
        out.types.append(kind)
        if kind == "response.output_item.added":
            item = event["item"]
            out.item_ids.append(item["id"])
            if item["type"] == "function_call":
                out.calls[item["id"]] = {
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": "",
                }
        elif kind == "response.output_text.delta":
            out.text += event["delta"]
            out.text_deltas.append(event["delta"])
            out.content_deltas += 1
        elif kind == "response.reasoning_summary_text.delta":
            out.reasoning += event["delta"]
            out.content_deltas += 1
        elif kind == "response.function_call_arguments.delta":
            out.calls[event["item_id"]]["arguments"] += event["delta"]
            out.content_deltas += 1
        elif kind == "response.completed":
            out.final = event["response"]
    return out


def calls_of(answer_spec: str) -> list[dict[str, str]]:
    return [
        {"call_id": call.id, "name": call.name, "arguments": call.arguments}
        for call in expected_answer(answer_spec).tool_calls
    ]


# --- the whole stream, through the openai SDK -------------------------------------------

SPECS = [
    "chaos",
    "chaos:text=7,reasoning=3,tools=2,arg_deltas=3,seed=5",
    "chaos:text=0,tools=1",
    "chaos:text=0,reasoning=2",
    "chaos:text=0",
    "chaos:text=9,reasoning=2,tools=1,lineend=crlf,comments=1,split=7",
    "chaos:text=5,lineend=cr,comments=1,pace_ms=1",
]


@pytest.mark.parametrize("spec", SPECS)
def test_sdk_stream_says_the_expected_answer(sdk: openai.OpenAI, spec: str) -> None:
    events = list(sdk.responses.create(model=spec, input="Say something.", stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    got = assemble(events)
    answer = expected_answer(spec)
    assert got.types[:2] == ["response.created", "response.in_progress"]
    assert got.types[-1] == "response.completed"
    assert got.text == answer.text
    assert got.reasoning == answer.reasoning
    assert list(got.calls.values()) == calls_of(spec)
    # The completed response holds every item whole, and the usage of what was sent.
    assert got.final is not None
    assert got.final["status"] == "completed"
    assert [item["id"] for item in got.final["output"]] == got.item_ids
    assert got.final["usage"]["output_tokens"] == got.content_deltas
    assert got.final["usage"]["input_tokens"] == 11  # a string input is one message


@pytest.mark.parametrize("spec", SPECS)
def test_sdk_stream_helper_accepts_the_stream(sdk: openai.OpenAI, spec: str) -> None:
    answer = expected_answer(spec)
    with sdk.responses.stream(model=spec, input=[USER]) as stream:  # type: ignore[list-item]
        for _ in stream:
            pass
        response = stream.get_final_response()
    assert response.status == "completed"
    assert response.id.startswith("resp_chaos_")
    assert response.output_text == answer.text
    kinds = [item.type for item in response.output]
    expected_kinds = (
        ["reasoning"] * bool(answer.reasoning)
        + ["message"] * bool(answer.text)
        + ["function_call"] * len(answer.tool_calls)
    )
    assert kinds == expected_kinds
    calls = [
        {"call_id": item.call_id, "name": item.name, "arguments": item.arguments}
        for item in response.output
        if item.type == "function_call"
    ]
    assert calls == calls_of(spec)
    summaries = [
        part.text for item in response.output if item.type == "reasoning" for part in item.summary
    ]
    assert summaries == ([answer.reasoning] if answer.reasoning else [])
    assert response.usage is not None
    assert response.usage.input_tokens == 11
    assert response.usage.total_tokens == 11 + response.usage.output_tokens


def test_event_order_and_shapes(client: httpx2.Client) -> None:
    spec = "chaos:text=2,reasoning=1,tools=1,arg_deltas=2"
    received = post_stream(client, spec)
    assert received.error is None
    objects = received.objects()
    assert [obj["type"] for obj in objects] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [obj["sequence_number"] for obj in objects] == list(range(len(objects)))
    answer = expected_answer(spec)
    created = objects[0]["response"]
    number = created["id"].removeprefix("resp_chaos_")
    assert created["status"] == "in_progress" and created["output"] == []
    assert created["usage"] is None and created["model"] == spec
    assert objects[1]["response"] == created
    rs, msg, fc = f"rs_{number}", f"msg_{number}", f"fc_{number}_0"
    assert objects[2]["item"] == {"id": rs, "type": "reasoning", "summary": []}
    reasoning = {"type": "summary_text", "text": answer.reasoning}
    assert objects[5] | {"sequence_number": None} == {
        "type": "response.reasoning_summary_text.done",
        "sequence_number": None,
        "item_id": rs,
        "output_index": 0,
        "summary_index": 0,
        "text": answer.reasoning,
    }
    assert objects[6]["part"] == reasoning
    assert objects[7]["item"] == {"id": rs, "type": "reasoning", "summary": [reasoning]}
    assert objects[8]["item"] == {
        "id": msg,
        "type": "message",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    assert objects[9]["part"] == {"type": "output_text", "text": "", "annotations": []}
    for delta in objects[10:12]:
        assert (delta["item_id"], delta["output_index"], delta["content_index"]) == (msg, 1, 0)
        assert delta["logprobs"] == []
    assert objects[12]["text"] == answer.text
    text = {"type": "output_text", "text": answer.text, "annotations": []}
    assert objects[13]["part"] == text
    message = objects[14]["item"]
    assert (message["status"], message["content"]) == ("completed", [text])
    [call] = answer.tool_calls
    assert objects[15]["item"] == {
        "id": fc,
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "status": "in_progress",
        "arguments": "",
    }
    assert {objects[16]["output_index"], objects[17]["output_index"]} == {2}
    assert objects[16]["delta"] + objects[17]["delta"] == call.arguments
    assert (objects[18]["name"], objects[18]["arguments"]) == (call.name, call.arguments)
    done_call = objects[19]["item"]
    assert (done_call["status"], done_call["arguments"]) == ("completed", call.arguments)
    final = objects[20]["response"]
    assert final["status"] == "completed"
    assert final["output"] == [objects[7]["item"], message, done_call]
    assert final["usage"] == {
        "input_tokens": 11,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 5,  # 1 reasoning + 2 text + 2 argument fragments
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 16,
    }


def test_every_event_is_named_and_framed_with_the_spec_line_ending(
    client: httpx2.Client,
) -> None:
    received = post_stream(client, "chaos:text=3,lineend=crlf,comments=1")
    raw = received.raw
    assert b"\r\n\r\n" in raw and b"\n\n" not in raw.replace(b"\r\n", b"")
    assert b": keepalive\r\n" in raw
    events = received.events()
    assert all(name == json.loads(data)["type"] for name, data in events)
    assert events[-1][0] == "response.completed"


def test_done_is_ignored(client: httpx2.Client) -> None:
    for done in (0, 1):
        received = post_stream(client, f"chaos:text=3,done={done}")
        assert b"[DONE]" not in received.raw
        assert received.objects()[-1]["type"] == "response.completed"


def test_item_ids_differ_between_responses(client: httpx2.Client) -> None:
    spec = "chaos:text=2,reasoning=1,tools=2"
    first = assemble(post_stream(client, spec).objects())
    second = assemble(post_stream(client, spec).objects())
    assert len(first.item_ids) == len(second.item_ids) == 4
    assert not set(first.item_ids) & set(second.item_ids)
    assert first.final is not None and second.final is not None
    assert first.final["id"] != second.final["id"]
    # The answer does not change: the tool calls' call ids are the answer's.
    assert list(first.calls.values()) == list(second.calls.values()) == calls_of(spec)


def test_input_tokens_count_the_input_items(client: httpx2.Client) -> None:
    items = [USER, {"role": "assistant", "content": "Hi."}, USER]
    final = assemble(post_stream(client, "chaos:text=4", input=items).objects()).final
    assert final is not None
    assert final["usage"]["input_tokens"] == 13
    assert final["usage"]["output_tokens"] == 4


# --- store: false, as OpenAI checks the items sent back -----------------------------------


def agent_turn(sdk: openai.OpenAI, model: str, items: list[Any]) -> Any:
    """A turn as Codex sends it: nothing stored, the reasoning sent back encrypted."""
    return sdk.responses.create(
        model=model, input=cast(Any, items), store=False, include=["reasoning.encrypted_content"]
    )


def test_encrypted_content_only_when_asked_and_whole_items_are_accepted_back(
    sdk: openai.OpenAI,
) -> None:
    spec = "chaos:text=3,reasoning=2,tools=1"
    plain = sdk.responses.create(model=spec, input=cast(Any, [USER]))
    assert [i.encrypted_content for i in plain.output if i.type == "reasoning"] == [None]
    first = agent_turn(sdk, spec, [USER])
    output = [item.model_dump(exclude_none=True) for item in first.output]
    assert [i["encrypted_content"] for i in output if i["type"] == "reasoning"] != [None]
    call = next(i for i in output if i["type"] == "function_call")
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    again = agent_turn(sdk, "chaos:text=2", [USER, *output, result])
    assert again.status == "completed"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("no-encrypted-content", "Items are not persisted when `store` is set to false"),
        ("truncated-summary", "Items are not persisted when `store` is set to false"),
        ("no-call", "No tool call found for function call output"),
    ],
)
def test_items_that_cannot_be_read_back_are_refused(
    sdk: openai.OpenAI, change: str, message: str
) -> None:
    spec = "chaos:text=3,reasoning=2,tools=1"
    output = [item.model_dump(exclude_none=True) for item in agent_turn(sdk, spec, [USER]).output]
    reasoning = next(i for i in output if i["type"] == "reasoning")
    call = next(i for i in output if i["type"] == "function_call")
    if change == "no-encrypted-content":  # as a half-formed item reaches an agent
        del reasoning["encrypted_content"]
    elif change == "truncated-summary":
        reasoning["summary"][0]["text"] = reasoning["summary"][0]["text"][:-1]
    else:
        output.remove(call)
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    with pytest.raises(openai.BadRequestError, match=message):
        agent_turn(sdk, "chaos:text=2", [USER, *output, result])
    # With store: true, the provider keeps the items: nothing to check here.
    sdk.responses.create(model="chaos:text=2", input=cast(Any, [USER, *output, result]))


# --- continuations ------------------------------------------------------------------------


def _parts(text: str) -> list[dict[str, Any]]:
    return [{"type": "output_text", "text": text[:3]}, {"type": "output_text", "text": text[3:]}]


def _prompt_input(prefix: str, anchor: str = "") -> list[dict[str, Any]]:
    prompt = CONTINUE + (f" Repeat <<<{anchor}>>>" if anchor else "")
    return [
        USER,
        {"type": "message", "role": "assistant", "content": _parts(prefix)},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]},
    ]


def _cuts() -> list[int]:
    starts = script_for(parse_spec("chaos")).starts
    zwj = TEXT.index("👩\u200d💻")
    return [1, starts[5], starts[5] + 1, zwj + 1, len(TEXT) - 1]


@pytest.mark.parametrize("cut", _cuts())
def test_prompt_mode_resumes_at_the_offset(client: httpx2.Client, cut: int) -> None:
    got = assemble(post_stream(client, "chaos", input=_prompt_input(TEXT[:cut])).objects())
    assert got.text == TEXT[cut:]
    assert got.final is not None
    [message] = got.final["output"]
    assert message["content"][0]["text"] == TEXT[cut:]


def test_prompt_mode_with_an_anchor_repeats_it_then_resumes_mid_delta(
    client: httpx2.Client,
) -> None:
    script = script_for(parse_spec("chaos"))
    cut = script.starts[4] + 2
    prefix = TEXT[:cut]
    anchor = prefix[-6:]
    got = assemble(post_stream(client, "chaos", input=_prompt_input(prefix, anchor)).objects())
    assert got.text_deltas == [anchor, script.text_deltas[4][2:], *script.text_deltas[5:]]
    # anchor=0 plays a model that does not repeat it.
    spec = "chaos:anchor=0"
    got = assemble(post_stream(client, spec, input=_prompt_input(prefix, anchor)).objects())
    assert got.text == TEXT[cut:]
    # An anchor that is not the prefix's tail is not repeated.
    got = assemble(post_stream(client, "chaos", input=_prompt_input(prefix, "nope")).objects())
    assert got.text == TEXT[cut:]


def test_continuation_reasons_anew_and_sends_tool_calls_whole(client: httpx2.Client) -> None:
    spec = "chaos:text=10,reasoning=3,tools=2"
    answer = expected_answer(spec)
    fresh = assemble(post_stream(client, spec).objects())
    cut = len(answer.text) // 2
    got = assemble(post_stream(client, spec, input=_prompt_input(answer.text[:cut])).objects())
    assert got.text == answer.text[cut:]
    assert got.reasoning == answer.reasoning
    assert list(got.calls.values()) == calls_of(spec)
    assert not set(got.item_ids) & set(fresh.item_ids)  # a new response: new ids


def test_whole_text_prefix_leaves_no_message_item(client: httpx2.Client) -> None:
    spec = "chaos:text=6,tools=1"
    answer = expected_answer(spec)
    got = assemble(post_stream(client, spec, input=_prompt_input(answer.text)).objects())
    assert got.text == ""
    assert "response.content_part.added" not in got.types
    assert got.final is not None
    assert [item["type"] for item in got.final["output"]] == ["function_call"]
    assert list(got.calls.values()) == calls_of(spec)


def test_prefill_with_continue_final_message(client: httpx2.Client) -> None:
    cut = 17
    items = [USER, {"role": "assistant", "content": TEXT[:cut]}]
    received = post_stream(client, "chaos", input=items, continue_final_message=True)
    assert assemble(received.objects()).text == TEXT[cut:]


def test_prefill_with_prefix_true_on_the_last_item(client: httpx2.Client) -> None:
    cut = 23
    prefill = {"type": "message", "role": "assistant", "content": _parts(TEXT[:cut])}
    items = [USER, prefill | {"prefix": True}]
    assert assemble(post_stream(client, "chaos", input=items).objects()).text == TEXT[cut:]


def test_a_trailing_assistant_item_without_a_flag_is_not_a_continuation(
    client: httpx2.Client,
) -> None:
    items = [USER, {"role": "assistant", "content": TEXT[:10]}]
    assert assemble(post_stream(client, "chaos", input=items).objects()).text == TEXT


def test_a_prefix_that_is_not_of_the_answer_gets_the_whole_answer(client: httpx2.Client) -> None:
    got = assemble(post_stream(client, "chaos", input=_prompt_input("Something else")).objects())
    assert got.text == TEXT


def test_prefill_0_refuses_a_trailing_assistant_item(client: httpx2.Client) -> None:
    items = [USER, {"role": "assistant", "content": TEXT[:10]}]
    body = {"model": "chaos:prefill=0", "input": items, "continue_final_message": True}
    for stream_flag in (True, False):
        response = client.post("/responses", json=body | {"stream": stream_flag})
        assert response.status_code == 400
        assert "does not support assistant message prefill" in response.json()["error"]["message"]
    # A prompt-mode continuation still works.
    got = assemble(post_stream(client, "chaos:prefill=0", input=_prompt_input(TEXT[:10])).objects())
    assert got.text == TEXT[10:]


def test_echo_and_echo_prefix(client: httpx2.Client) -> None:
    got = assemble(post_stream(client, "chaos:echo=4", input=_prompt_input(TEXT[:20])).objects())
    assert got.text == TEXT[16:]
    got = assemble(
        post_stream(client, "chaos:echo_prefix=1", input=_prompt_input(TEXT[:20])).objects()
    )
    assert got.text == TEXT


# --- faults, as raw bytes ------------------------------------------------------------------


def _assert_numbered(objects: list[dict[str, Any]]) -> None:
    assert [obj["sequence_number"] for obj in objects] == list(range(len(objects)))


@pytest.mark.parametrize("at", [0, 1, 7, 20])
def test_reset_after_exactly_at_deltas(client: httpx2.Client, at: int) -> None:
    spec = f"chaos:fault=reset,at={at}"
    received = post_stream(client, spec)
    assert isinstance(received.error, httpx2.ReadError | httpx2.RemoteProtocolError)
    objects = received.objects()
    _assert_numbered(objects)
    got = assemble(objects)
    assert got.text == first_deltas(spec, at)
    assert got.final is None
    if at:
        assert objects[-1]["type"] == "response.output_text.delta"
    else:  # nothing but the opening events
        assert got.types == ["response.created", "response.in_progress"]


def test_reset_without_at_fires_half_way(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:text=10,fault=reset")
    assert received.error is not None
    assert assemble(received.objects()).text == first_deltas("chaos:text=10", 5)


def test_close_is_an_incomplete_chunked_read(client: httpx2.Client) -> None:
    spec = "chaos:fault=close,at=4"
    received = post_stream(client, spec)
    assert isinstance(received.error, httpx2.RemoteProtocolError)
    assert "incomplete chunked read" in str(received.error)
    assert assemble(received.objects()).text == first_deltas(spec, 4)


def test_stall_is_a_read_timeout(upstream: ChaosUpstream) -> None:
    timeout = httpx2.Timeout(10, read=0.3)
    with httpx2.Client(base_url=upstream.base_url, timeout=timeout) as client:
        started = time.monotonic()
        received = post_stream(client, "chaos:fault=stall,at=3")
    assert isinstance(received.error, httpx2.ReadTimeout)
    assert time.monotonic() - started < 5
    assert assemble(received.objects()).text == first_deltas("chaos", 3)


def test_no_finish_ends_cleanly_without_completed(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:fault=no_finish,at=6")
    assert received.error is None
    objects = received.objects()
    _assert_numbered(objects)
    got = assemble(objects)
    assert got.text == first_deltas("chaos", 6)
    assert got.final is None
    assert objects[-1]["type"] == "response.output_text.delta"


def test_error_is_a_transient_error_event(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:fault=error,at=5")
    assert received.error is None
    objects = received.objects()
    _assert_numbered(objects)
    assert assemble(objects).text == first_deltas("chaos", 5)
    error = objects[-1]
    assert received.events()[-1][0] == "error"
    assert error == {
        "type": "error",
        "code": "server_error",
        "message": "The server had an error processing your request.",
        "param": None,
        "sequence_number": len(objects) - 1,
    }
    assert is_transient_error(error)
    assert objects[-2]["type"] == "response.output_text.delta"


def test_error_fatal_is_not_transient(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:fault=error_fatal,at=2")
    assert received.error is None
    objects = received.objects()
    _assert_numbered(objects)
    error = objects[-1]
    assert (error["type"], error["code"]) == ("error", "invalid_prompt")
    assert "content management policy" in error["message"]
    assert not is_transient_error(error)
    assert assemble(objects).text == first_deltas("chaos", 2)


@pytest.mark.parametrize(
    ("fault", "code"), [("error_done", "server_error"), ("finish_error", "500")]
)
def test_failed_response_is_transient(client: httpx2.Client, fault: str, code: str) -> None:
    received = post_stream(client, f"chaos:fault={fault},at=3")
    assert received.error is None
    objects = received.objects()
    _assert_numbered(objects)
    failed = objects[-1]
    assert failed["type"] == "response.failed"
    response = failed["response"]
    assert response["status"] == "failed"
    assert response["id"] == objects[0]["response"]["id"]
    assert response["error"]["code"] == code
    assert response["error"]["message"]
    assert is_transient_error(response["error"])
    got = assemble(objects)
    assert got.text == first_deltas("chaos", 3)
    assert got.final is None


def test_malformed_event_then_the_rest_of_the_stream(client: httpx2.Client) -> None:
    received = post_stream(client, "chaos:fault=malformed,at=2")
    assert received.error is None
    events = received.events()
    bad = [index for index, (_, data) in enumerate(events) if not data.endswith("}")]
    assert len(bad) == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[bad[0]][1])
    objects = received.objects()
    # After the opening events, the item and its part: then two deltas, then the bad one.
    assert [obj["type"] for obj in objects[bad[0] - 2 : bad[0]]] == [
        "response.output_text.delta"
    ] * 2
    assert objects[bad[0] - 3]["type"] == "response.content_part.added"
    _assert_numbered(objects)  # the malformed event takes no number
    got = assemble(objects)
    assert got.text == TEXT
    assert got.final is not None


def test_at_counts_reasoning_and_argument_fragments(client: httpx2.Client) -> None:
    spec = "chaos:reasoning=3,text=2,tools=1,arg_deltas=4,fault=close"
    answer = expected_answer(spec)
    got = assemble(post_stream(client, f"{spec},at=4").objects())
    assert (got.reasoning, got.text, got.calls) == (answer.reasoning, first_deltas(spec, 1), {})
    got = assemble(post_stream(client, f"{spec},at=7").objects())
    assert got.content_deltas == 7
    assert got.text == answer.text
    fragments = script_for(parse_spec(spec)).tool_fragments[0]
    [call] = got.calls.values()
    assert call["arguments"] == "".join(fragments[:2])
    assert call["call_id"] == answer.tool_calls[0].id


@pytest.mark.parametrize(
    ("fault", "status"), [("http_400", 400), ("http_429", 429), ("http_503", 503)]
)
def test_http_faults_answer_an_error_status(client: httpx2.Client, fault: str, status: int) -> None:
    for stream_flag in (True, False):
        body = {"model": f"chaos:fault={fault}", "input": "hi", "stream": stream_flag}
        response = client.post("/responses", json=body)
        assert response.status_code == status
        assert response.json()["error"]["message"]


def test_reset_before_any_byte(client: httpx2.Client) -> None:
    with pytest.raises((httpx2.ReadError, httpx2.RemoteProtocolError)):
        client.post("/responses", json={"model": "chaos:fault=reset_before", "input": "hi"})


def test_times_faults_only_the_first_requests(client: httpx2.Client) -> None:
    spec = "chaos:text=6,fault=reset,at=2,times=1"
    assert post_stream(client, spec).error is not None
    clean = post_stream(client, spec)
    assert clean.error is None
    assert assemble(clean.objects()).text == expected_answer(spec).text


def test_sdk_sees_an_error_event_and_a_reset(sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model="chaos:fault=error,at=2", input="hi", stream=True))
    assert events[-1].type == "error"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    with pytest.raises(openai.APIConnectionError):
        list(sdk.responses.create(model="chaos:fault=reset,at=2", input="hi", stream=True))


# --- non-streaming --------------------------------------------------------------------------


def test_non_streaming_returns_the_whole_response(client: httpx2.Client) -> None:
    spec = "chaos:text=7,reasoning=2,tools=2"
    document = json_document(client.post("/responses", json={"model": spec, "input": [USER]}))
    answer = expected_answer(spec)
    assert document["object"] == "response"
    assert document["status"] == "completed"
    assert document["model"] == spec
    reasoning, message, *calls = document["output"]
    assert reasoning["summary"] == [{"type": "summary_text", "text": answer.reasoning}]
    assert message["content"] == [{"type": "output_text", "text": answer.text, "annotations": []}]
    assert [
        {"call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]}
        for call in calls
    ] == calls_of(spec)
    # 2 reasoning + 7 text + 2 calls of 4 fragments
    assert document["usage"]["output_tokens"] == 17
    assert document["usage"]["input_tokens"] == 11


def test_non_streaming_through_the_sdk(sdk: openai.OpenAI) -> None:
    spec = "chaos:text=5,tools=1"
    response = sdk.responses.create(model=spec, input="hi")
    assert response.output_text == expected_answer(spec).text
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.call_id == expected_answer(spec).tool_calls[0].id


def test_non_streaming_continuation(client: httpx2.Client) -> None:
    body = {"model": "chaos", "input": _prompt_input(TEXT[:12])}
    [message] = client.post("/responses", json=body).json()["output"]
    assert message["content"][0]["text"] == TEXT[12:]


def test_non_streaming_faults(client: httpx2.Client) -> None:
    for fault in ("error", "error_fatal", "no_finish", "malformed", "finish_error"):
        body = {"model": f"chaos:text=3,fault={fault}", "input": "hi"}
        document = client.post("/responses", json=body).json()
        assert document["output"][0]["content"][0]["text"] == expected_answer("chaos:text=3").text
    with pytest.raises(httpx2.ReadError):
        client.post("/responses", json={"model": "chaos:fault=reset", "input": "hi"})
    with pytest.raises(httpx2.RemoteProtocolError, match="without sending complete message body"):
        client.post("/responses", json={"model": "chaos:fault=close", "input": "hi"})


def test_the_next_turn_with_function_call_outputs_is_answered_in_text(
    sdk: openai.OpenAI,
) -> None:
    spec = "chaos:text=4,reasoning=2,tools=1"
    first = agent_turn(sdk, spec, [USER])
    output = [item.model_dump(exclude_none=True) for item in first.output]
    (call,) = [item for item in output if item["type"] == "function_call"]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
    again = agent_turn(sdk, spec, [USER, *output, result])
    # A new answer in text: the agent's tool loop ends.
    assert [item.type for item in again.output] == ["reasoning", "message"]
    assert again.output_text == expected_answer(spec.replace("tools=1", "tools=0")).text
