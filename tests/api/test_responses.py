"""The Responses API end to end: real sockets, the chaos upstream, the openai SDK.

``client.responses.stream()`` checks event order strictly (one identity, every item
added before its events and done before the end); beside it, the raw events are
checked for the section 2a contract: sequence numbers 0, 1, 2… with no gap, one
``response.created``, one terminal event, item indices contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import httpx2
import orjson
import pytest
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import calls_of
from tests.servers import RunningGateway, recovering_config, running_gateway

FAULTS = ["reset", "close", "stall", "error", "error_done", "no_finish", "finish_error"]
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


def config(chaos: ChaosUpstream, **overrides: Any) -> Any:
    return recovering_config(chaos.base_url, **overrides)


@dataclass
class Streamed:
    events: list[Any] = field(default_factory=list)
    final: Any = None

    @property
    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def text(self) -> str:
        return "".join(e.delta for e in self.events if e.type == "response.output_text.delta")

    def reasoning(self) -> str:
        return "".join(
            e.delta for e in self.events if e.type == "response.reasoning_summary_text.delta"
        )

    def calls(self) -> list[tuple[str, str, str]]:
        done = [e.item for e in self.events if e.type == "response.output_item.done"]
        return [(i.call_id, i.name, i.arguments) for i in done if i.type == "function_call"]


def check_contract(streamed: Streamed) -> None:
    """Section 2a, as a client sees it."""
    events = streamed.events
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert streamed.types.count("response.created") == 1
    assert streamed.types.count("response.in_progress") <= 1
    assert sum(t in TERMINAL for t in streamed.types) == 1
    assert events[-1].type in TERMINAL
    ids = {e.response.id for e in events if hasattr(e, "response")}
    assert len(ids) == 1
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == list(range(len(added)))
    assert len({e.item.id for e in added}) == len(added)
    for event in events:
        if getattr(event, "item_id", None) is not None:
            assert event.item_id == added[event.output_index].item.id
    # Items strictly one after another (ARCHITECTURE.md section 6b rule 2).
    open_item = None
    for event in events:
        index = getattr(event, "output_index", None)
        if event.type == "response.output_item.added":
            assert open_item is None, f"item {index} added while item {open_item} is open"
            open_item = index
        elif event.type == "response.output_item.done":
            assert index == open_item
            open_item = None
        elif index is not None:
            assert index == open_item, f"{event.type} of item {index} outside it"
    assert open_item is None


def stream(sdk: OpenAI, model: str, **extra: Any) -> Streamed:
    streamed = Streamed()
    extra.setdefault("input", "Tell me.")
    with sdk.responses.stream(model=model, **extra) as events:
        for event in events:
            streamed.events.append(event)
        streamed.final = events.get_final_response()
    check_contract(streamed)
    return streamed


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("at", [0, 9, 30], ids=["before-content", "mid-text", "after-last"])
def test_text_survives_every_fault_at_every_point(sdk: OpenAI, fault: str, at: int) -> None:
    model = f"chaos:text=30,seed=20,fault={fault},at={at},times=1"
    streamed = stream(sdk, model)
    expected = expected_answer(model).text
    assert streamed.text() == expected
    assert streamed.final.output_text == expected
    assert streamed.final.status == "completed"
    done = [e for e in streamed.events if e.type == "response.output_text.done"]
    assert [e.text for e in done] == [expected]  # the *.done events carry the whole text


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize(
    ("at", "calls"),
    [
        (0, 2),  # nothing sent: whole restart
        (4, 2),  # mid-text: continue, then both calls
        (10, 2),  # text + half of call 0: drop it, continue, both calls
        (14, 1),  # call 0 complete: finish with it, no upstream call
        # After call 1's last argument delta, before its done event: it is not whole
        # until the upstream says so, so the answer ends with call 0.
        (22, 1),
    ],
    ids=["before-content", "mid-text", "mid-arguments", "between-calls", "last-arguments"],
)
def test_function_calls_survive_every_fault_at_every_point(
    sdk: OpenAI, fault: str, at: int, calls: int
) -> None:
    model = f"chaos:text=6,tools=2,arg_deltas=4,seed=21,fault={fault},at={at},times=1"
    streamed = stream(sdk, model)
    assert streamed.text() == expected_answer(model).text
    assert streamed.calls() == calls_of(model, calls)
    final_calls = [i for i in streamed.final.output if i.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in final_calls] == calls_of(model, calls)
    for _, _, arguments in streamed.calls():
        orjson.loads(arguments)  # whole JSON
    # Argument deltas only ever belong to an item that was added and is done.
    deltas = [e for e in streamed.events if e.type == "response.function_call_arguments.delta"]
    assert "".join(e.delta for e in deltas) == "".join(c[2] for c in calls_of(model, calls))


@pytest.mark.parametrize("at", [3, 6, 12], ids=["mid-reasoning", "before-text", "mid-text"])
def test_reasoning_is_whole_and_never_sent_twice(sdk: OpenAI, at: int) -> None:
    model = f"chaos:text=20,reasoning=6,seed=22,fault=reset,at={at},times=1"
    streamed = stream(sdk, model)
    answer = expected_answer(model)
    assert streamed.text() == answer.text
    # A cut reasoning item never reaches the client: the one it gets is whole.
    assert streamed.reasoning() == answer.reasoning
    items = [e.item.type for e in streamed.events if e.type == "response.output_item.added"]
    assert items.count("reasoning") == 1


def agent_turn(sdk: OpenAI, model: str, items: list[Any]) -> Any:
    """A turn as Codex sends it: nothing stored, the reasoning sent back encrypted."""
    return sdk.responses.create(
        model=model, input=cast(Any, items), store=False, include=["reasoning.encrypted_content"]
    )


@pytest.mark.parametrize("fault", ["reset", "error", "stall"])
@pytest.mark.parametrize(
    "at", [3, 6, 12, 25], ids=["mid-reasoning", "before-text", "mid-text", "mid-arguments"]
)
def test_an_agents_next_turn_accepts_every_item_of_a_recovered_answer(
    sdk: OpenAI, fault: str, at: int
) -> None:
    """As Codex does (``store: false``, encrypted reasoning): the first turn's output goes
    back as input, and the upstream (as OpenAI's) refuses an item it cannot read."""
    model = f"chaos:text=20,reasoning=6,tools=1,arg_deltas=4,seed=40,fault={fault},at={at},times=1"
    question = [{"role": "user", "content": "Tell me."}]
    streamed = stream(
        sdk, model, input=question, store=False, include=["reasoning.encrypted_content"]
    )
    answer = expected_answer(model)
    assert streamed.text() == answer.text and streamed.calls() == calls_of(model)
    output = [item.model_dump(exclude_none=True) for item in streamed.final.output]
    reasoning = [item for item in output if item["type"] == "reasoning"]
    assert len(reasoning) == 1 and reasoning[0]["encrypted_content"]
    call = next(item for item in output if item["type"] == "function_call")
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
    # The next turn, as an agent sends it: a new question, so a whole new answer.
    again = "chaos:text=5,seed=41"
    follow = agent_turn(sdk, again, [*question, *output, result])
    assert follow.status == "completed" and follow.output_text == expected_answer(again).text


def test_utf8_split_across_reads_and_a_seam(sdk: OpenAI) -> None:
    model = "chaos:text=40,seed=23,split=3,fault=reset,at=17,times=1"
    assert stream(sdk, model).text() == expected_answer(model).text


def test_create_stream_true_keeps_the_contract(sdk: OpenAI) -> None:
    model = "chaos:text=25,seed=24,fault=error,at=11,times=1"
    streamed = Streamed(events=list(sdk.responses.create(model=model, input="x", stream=True)))
    check_contract(streamed)
    assert streamed.text() == expected_answer(model).text


def test_raw_events_are_one_type_each_and_usage_is_summed(recovering: RunningGateway) -> None:
    model = "chaos:text=20,seed=25,fault=reset,at=8,times=1"
    body = {"model": model, "input": "x", "stream": True}
    with httpx2.Client(base_url=recovering.base_url, timeout=10) as http:
        raw = http.post("/responses", json=body, headers={"authorization": "Bearer k"}).content
    events = [e for e in raw.split(b"\n\n") if e]
    for number, event in enumerate(events):
        head, _, data = event.partition(b"\ndata: ")
        obj = orjson.loads(data)
        assert head == b"event: " + obj["type"].encode()
        assert obj["sequence_number"] == number
    final = orjson.loads(events[-1].partition(b"\ndata: ")[2])["response"]
    # Two legs; the broken one reported nothing, so the sum is the second leg's.
    assert final["usage"]["output_tokens"] > 0
    assert final["status"] == "completed"


def test_non_streaming_is_recovered(sdk: OpenAI) -> None:
    model = "chaos:text=30,tools=1,seed=26,fault=reset,at=12,times=1"
    response = sdk.responses.create(model=model, input="x")
    assert response.output_text == expected_answer(model).text
    calls = [(c.call_id, c.name, c.arguments) for c in response.output if c.type == "function_call"]
    assert calls == calls_of(model)


def test_an_answer_that_cannot_be_completed_ends_with_error_and_failed(sdk: OpenAI) -> None:
    model = "chaos:text=30,seed=27,fault=reset,at=10"  # every attempt breaks
    streamed = Streamed(events=list(sdk.responses.create(model=model, input="x", stream=True)))
    assert streamed.types[-2:] == ["error", "response.failed"]
    assert [e.sequence_number for e in streamed.events] == list(range(len(streamed.events)))
    failed = streamed.events[-1].response
    assert failed.status == "failed" and "incomplete" in failed.error.message
    assert expected_answer(model).text.startswith(streamed.text()) and streamed.text()
    # The SDK's stream helper raises: the answer never looks complete.
    with pytest.raises(RuntimeError, match="response.completed"):
        with sdk.responses.stream(model=model, input="x") as events:
            for _ in events:
                pass
            events.get_final_response()


def test_a_route_whose_upstreams_speak_chat_only_says_so(chaos: ChaosUpstream) -> None:
    with running_gateway(config(chaos, upstream={"protocols": ["chat"]})) as gateway:
        with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
            with pytest.raises(Exception) as raised:
                client.responses.create(model="chaos:text=3", input="x")
            chat = client.chat.completions.create(
                model="chaos:text=3", messages=[{"role": "user", "content": "x"}]
            )
    assert getattr(raised.value, "status_code", None) == 404
    assert "serves the responses API" in str(raised.value)
    assert chat.choices[0].message.content == expected_answer("chaos:text=3").text


# -- resume ---------------------------------------------------------------------------


def _first_events(gateway: RunningGateway, model: str, count: int) -> tuple[str, str, list[Any]]:
    """Start a paced stream, read ``count`` events, and leave: (run id, response id, events)."""
    with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
        raw = client.responses.with_raw_response.create(model=model, input="x", stream=True)
        run_id = raw.headers["x-run-id"]
        events: list[Any] = []
        for event in raw.parse():
            events.append(event)
            if len(events) == count:
                break
    return run_id, events[0].response.id, events


def test_retrieve_stream_starting_after_resumes_exactly(recovering: RunningGateway) -> None:
    model = "chaos:text=40,seed=28,pace_ms=20"
    _, response_id, first = _first_events(recovering, model, 12)
    with OpenAI(base_url=recovering.base_url, api_key="k", max_retries=0) as client:
        rest = list(
            client.responses.retrieve(
                response_id, stream=True, starting_after=first[-1].sequence_number
            )
        )
    streamed = Streamed(events=first + rest)
    check_contract(streamed)
    assert streamed.text() == expected_answer(model).text


def test_resume_by_run_id_and_by_the_runs_endpoint(recovering: RunningGateway) -> None:
    model = "chaos:text=40,seed=29,pace_ms=20"
    run_id, _, first = _first_events(recovering, model, 10)
    headers = {"authorization": "Bearer k"}
    with httpx2.Client(base_url=recovering.base_url, timeout=10, headers=headers) as http:
        resumed = http.post(
            "/responses",
            json={"model": model, "input": "x", "stream": True},
            headers={"x-run-id": run_id, "x-resume-from": "10"},
        ).content
        again = http.get(f"/runs/{run_id}/events", headers={"last-event-id": "10"}).content
    sequence = [orjson.loads(e.partition(b"data: ")[2])["sequence_number"] for e in _split(resumed)]
    assert sequence[0] == 10 and sequence == list(range(10, 10 + len(sequence)))
    assert [e for e in _split(again)][0].startswith(b"id: 11\nevent: ")
    text = "".join(e.delta for e in first if e.type == "response.output_text.delta")
    for event in _split(resumed):
        obj = orjson.loads(event.partition(b"data: ")[2])
        if obj["type"] == "response.output_text.delta":
            text += obj["delta"]
    assert text == expected_answer(model).text


def test_another_credential_cannot_resume(recovering: RunningGateway) -> None:
    model = "chaos:text=30,seed=30,pace_ms=20"
    _, response_id, _ = _first_events(recovering, model, 5)
    with OpenAI(base_url=recovering.base_url, api_key="other", max_retries=0) as client:
        with pytest.raises(Exception) as raised:
            list(client.responses.retrieve(response_id, stream=True, starting_after=4))
    assert getattr(raised.value, "status_code", None) == 404


def _split(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e and not e.startswith(b":")]


# -- previous_response_id after a recovered answer --------------------------------------


def test_previous_response_id_of_a_recovered_answer_sends_the_whole_answer(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    first_model = "chaos:text=30,seed=31,fault=reset,at=12,times=1"
    first = sdk.responses.create(model=first_model, input="first question")
    assert first.output_text == expected_answer(first_model).text
    second_model = "chaos:text=5,seed=32"
    second = sdk.responses.create(
        model=second_model, input="second question", previous_response_id=first.id
    )
    assert second.output_text == expected_answer(second_model).text
    sent = chaos.requests_for(second_model)[-1].body
    assert "previous_response_id" not in sent  # the upstream's copy of `first` is cut short
    assert sent["input"] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": expected_answer(first_model).text},
        {"role": "user", "content": "second question"},
    ]


def test_previous_response_id_of_an_unbroken_answer_is_passed_through(
    sdk: OpenAI, chaos: ChaosUpstream
) -> None:
    first = sdk.responses.create(model="chaos:text=5,seed=33", input="q")
    second_model = "chaos:text=5,seed=34"
    sdk.responses.create(model=second_model, input="q2", previous_response_id=first.id)
    sent = chaos.requests_for(second_model)[-1].body
    assert sent["previous_response_id"] == first.id and sent["input"] == "q2"


@pytest.mark.parametrize("mode", ["vllm", "prefix"])
def test_a_refused_prefill_continues_in_prompt_mode_and_never_masks_the_failure(
    chaos: ChaosUpstream, mode: str
) -> None:
    seed = 35 if mode == "vllm" else 36  # times=1 counts per spec string
    model = f"chaos:text=30,seed={seed},prefill=0,fault=reset,at=10,times=1"
    with running_gateway(config(chaos, upstream={"continuation": mode})) as gateway:
        with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
            with client.responses.stream(model=model, input="x") as events:
                streamed = Streamed(events=list(events))
    check_contract(streamed)
    assert streamed.text() == expected_answer(model).text
    original, refused, accepted = chaos.requests_for(model)
    assert refused.body["input"][-1]["role"] == "assistant"  # the prefill, refused with a 400
    assert accepted.body["input"][-1]["role"] == "user"  # then prompt mode, on the same leg


def test_the_clients_query_string_goes_with_every_leg(sdk: OpenAI, chaos: ChaosUpstream) -> None:
    """Azure-style ``?api-version=…``, or any query a client sends: on the first leg and on
    its continuation."""
    model = "chaos:text=20,seed=42,fault=reset,at=8,times=1"
    chaos.requests.clear()
    with sdk.responses.stream(
        model=model, input="x", extra_query={"api-version": "2025-04-01-preview"}
    ) as events:
        for _ in events:
            pass
        assert events.get_final_response().output_text == expected_answer(model).text
    legs = [r for r in chaos.requests if r.path == "/v1/responses"]
    assert [r.query for r in legs] == ["api-version=2025-04-01-preview"] * 2


STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@pytest.mark.parametrize("fault", ["reset", "stall", "error", "no_finish", "error_done"])
@pytest.mark.parametrize(
    "at",
    [0, 1, 2, 8, 20],
    ids=["before-anything", "first-delta", "mid-reasoning", "mid-text", "mid-arguments"],
)
def test_every_raw_event_validates_against_the_newest_sdks_types(
    recovering: RunningGateway, fault: str, at: int
) -> None:
    """The strict check an outside client makes: every SSE event of a recovered stream,
    validated (not constructed) against the openai SDK's own event types, which gain
    required fields (openai 3.57: usage's cache_write_tokens)."""
    model = f"chaos:text=10,reasoning=4,tools=1,seed=23,fault={fault},at={at},times=1"
    body = {"model": model, "input": "Tell me.", "stream": True, **AGENT}
    raw = httpx2.post(recovering.base_url + "/responses", json=body, timeout=20).content
    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert events[-1]["type"] == "response.completed"


AGENT = {"store": False, "include": ["reasoning.encrypted_content"]}
