"""The Gemini splicer and adapter, scripted: upstream chunks in, client chunks out (no sockets)."""

from __future__ import annotations

from typing import Any

import orjson
from google.genai import types

from gateway.errors import UpstreamFailure
from gateway.protocols.gemini import GEMINI, model_parts, parse_event
from gateway.protocols.gemini_items import GeminiAccumulator
from gateway.protocols.gemini_splice import GeminiSplicer
from gateway.recovery.events import Chunk, InBandError
from gateway.recovery.plan import Plan, plan_recovery
from gateway.recovery.seam import SeamRule
from gateway.upstream.continuation import Continuing
from gateway.upstream.sse import RawJSONDecoder


def chunk(
    *parts: dict[str, Any], finish: str | None = None, rid: str = "r0", usage: Any = None
) -> Chunk:
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    obj: dict[str, Any] = {"candidates": [candidate], "modelVersion": f"m-{rid}", "responseId": rid}
    if usage is not None:
        obj["usageMetadata"] = usage
    return Chunk(orjson.dumps(obj), obj)


def client_chunks(out: bytes) -> list[dict[str, Any]]:
    chunks = []
    for event in out.split(b"\n\n"):
        if event:
            assert event.startswith(b"data: ")
            obj = orjson.loads(event[6:])
            types.GenerateContentResponse.model_validate(obj)
            chunks.append(obj)
    return chunks


def new_splicer() -> GeminiSplicer:
    accumulator = GeminiAccumulator()
    accumulator.origin = "gemini"
    return GeminiSplicer(accumulator)


def test_the_first_leg_goes_out_byte_for_byte() -> None:
    splicer = new_splicer()
    first = chunk({"text": "Hello"})
    assert splicer.feed(first) == b"data: " + first.data + b"\n\n"
    last = chunk({"text": " world", "thoughtSignature": "c2ln"}, finish="STOP")
    assert splicer.feed(last) == b"data: " + last.data + b"\n\n"
    assert splicer.finished and splicer.sent.text == "Hello world"
    assert splicer.close() == b""


def test_a_held_call_ends_the_answer_with_finish_reason_on_its_own_chunk() -> None:
    splicer = new_splicer()
    splicer.feed(chunk({"text": "Let me look."}))
    call = {"functionCall": {"name": "search", "args": {"q": "x"}}, "thoughtSignature": "c2ln"}
    assert splicer.feed(chunk(call, usage={"promptTokenCount": 5})) is None  # held
    splicer.end_leg()
    snapshot = splicer.snapshot()
    assert snapshot.completed_tool_calls == 1 and not snapshot.in_flight_tool_call
    assert plan_recovery(snapshot) is Plan.SYNTHESIZE_TOOL_USE
    (last,) = client_chunks(splicer.synthesize_tool_use())
    candidate = last["candidates"][0]
    assert candidate["content"]["parts"] == [call]  # whole, with its signature
    assert candidate["finishReason"] == "STOP"
    assert last["responseId"] == "r0" and last["usageMetadata"]["promptTokenCount"] == 5
    assert [c.name for c in splicer.sent.tool_calls] == ["search"]


def test_a_held_call_goes_out_with_the_next_chunk_that_says_something() -> None:
    splicer = new_splicer()
    call = {"functionCall": {"name": "a", "args": {}}}
    assert splicer.feed(chunk(call)) is None
    assert splicer.feed(chunk(usage={"promptTokenCount": 1})) is None  # usage alone
    (out,) = client_chunks(splicer.feed(chunk({"text": "more"})) or b"")
    assert out["candidates"][0]["content"]["parts"] == [call, {"text": "more"}]


def test_a_later_leg_keeps_the_first_identity_trims_the_seam_and_shows_no_thoughts() -> None:
    splicer = new_splicer()
    splicer.feed(chunk({"text": "I think", "thought": True}))
    splicer.feed(chunk({"text": "The answer is "}))
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT, SeamRule("answer is ", restart=True))
    assert splicer.feed(chunk({"text": "Thinking again", "thought": True}, rid="r1")) is None
    signed = {"text": "", "thought": True, "thoughtSignature": "c2ln"}
    thought = signed | {"text": "and again"}
    (kept,) = client_chunks(splicer.feed(chunk(thought, rid="r1")) or b"")
    assert kept["candidates"][0]["content"]["parts"] == [signed]  # its signature, no text
    out = splicer.feed(chunk({"text": "answer is 42."}, finish="STOP", rid="r1", usage={}))
    (last,) = client_chunks(out or b"")
    assert (last["responseId"], last["modelVersion"]) == ("r0", "m-r0")
    assert last["candidates"][0]["content"]["parts"] == [{"text": "42."}]
    assert splicer.sent.text == "The answer is 42." and splicer.sent.reasoning == "I think"


def test_a_finish_with_nothing_left_to_say_still_has_a_part() -> None:
    splicer = new_splicer()
    splicer.feed(chunk({"text": "Done"}))
    (last,) = client_chunks(splicer.feed(chunk(finish="STOP")) or b"")
    assert last["candidates"][0]["content"]["parts"] == [{"text": ""}]


def test_a_later_legs_call_id_that_the_client_has_is_made_unique() -> None:
    splicer = new_splicer()
    splicer.feed(chunk({"functionCall": {"name": "a", "args": {}, "id": "c1"}}))
    splicer.feed(chunk({"text": "x"}))
    splicer.end_leg()
    splicer.begin_leg(Plan.CONTINUE_TEXT)
    splicer.feed(chunk({"functionCall": {"name": "b", "args": {}, "id": "c1"}}, finish="STOP"))
    assert [c.id for c in splicer.sent.tool_calls] == ["c1", "c1_1"]


def test_a_failed_stream_ends_with_google_raw_error_object() -> None:
    splicer = new_splicer()
    error = splicer.fail(UpstreamFailure("Upstream 'x' reset the connection."))
    assert error.endswith(b"\n\n") and not error.startswith(b"data:")
    body = orjson.loads(error)
    assert body == {
        "error": {
            "code": 502,
            "message": "Upstream 'x' reset the connection.",
            "status": "UNAVAILABLE",
        }
    }
    assert GEMINI.is_terminal(error) and not GEMINI.succeeded(error)


def test_replay_rebuilds_what_the_client_has() -> None:
    splicer = new_splicer()
    out = splicer.feed(chunk({"text": "a", "thought": True})) or b""
    out += splicer.feed(chunk({"text": "b"})) or b""
    out += splicer.feed(chunk({"text": "c", "thoughtSignature": "c2ln"}, finish="STOP")) or b""
    events = [event + b"\n\n" for event in out.split(b"\n\n") if event]
    replayed = GEMINI.replay(events)
    assert (replayed.text, replayed.reasoning, replayed.finish_reason) == ("bc", "a", "STOP")
    assert replayed.parts == splicer.sent.parts
    assert GEMINI.is_terminal(events[-1]) and GEMINI.succeeded(events[-1])
    assert not GEMINI.is_terminal(events[0])


def test_a_continuation_sends_signatures_back_only_to_the_provider_that_made_them() -> None:
    sent = GeminiAccumulator()
    sent.record({"text": "hm", "thought": True, "thoughtSignature": "dGg="}, "gemini")
    sent.record({"text": "Hello ", "thoughtSignature": "dHg="}, "gemini")
    sent.record({"text": "there  "}, "gemini")
    sent.origin = "gemini"
    assert model_parts(sent, "Hello there") == [
        {"text": "hm", "thought": True, "thoughtSignature": "dGg="},
        {"text": "Hello ", "thoughtSignature": "dHg="},
        {"text": "there"},  # a prefill's trailing whitespace cut
    ]
    sent.origin = "vertex"  # the other provider: its signatures would be "corrupted"
    assert model_parts(sent, "Hello there  ") == [
        {"text": "hm", "thought": True},
        {"text": "Hello "},
        {"text": "there  "},
    ]
    body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}
    continued = GEMINI.continuation(body, sent, Continuing("prompt", "Go on.", anchored=False))
    assert continued is not None and not continued.prefill
    roles = [turn["role"] for turn in continued.body["contents"]]
    assert roles == ["user", "model", "user"]


def test_in_band_errors_in_either_form_are_errors() -> None:
    decoder = RawJSONDecoder()
    data = b'data: {"candidates":[]}\r\n\r\n'
    raw = b'{\n  "error": {\n    "code": 503,\n    "message": "overloaded",\n'
    assert decoder.feed(data + raw) == [b'{"candidates":[]}']
    (payload,) = decoder.feed(b'    "status": "UNAVAILABLE"\n  }\n}\n')
    event = parse_event(payload)
    assert isinstance(event, InBandError) and event.error["code"] == 503
    as_data = parse_event(b'{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}')
    assert isinstance(as_data, InBandError) and event.message == "overloaded"
