"""The splicer, fed scripted upstream legs (no sockets): the client stream contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from gateway.protocols import CHAT
from gateway.protocols.chat_splice import Splicer
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.events import Chunk
from gateway.recovery.plan import Plan, plan_recovery
from gateway.recovery.seam import SeamRule


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    leg: int = 0,
    usage: dict[str, int] | None = None,
) -> Chunk:
    obj: dict[str, Any] = {
        "id": f"chatcmpl-leg{leg}",
        "object": "chat.completion.chunk",
        "created": 100 + leg,
        "model": f"model-{leg}",
        "system_fingerprint": f"fp{leg}",
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        obj["usage"] = usage
    return Chunk(orjson.dumps(obj), obj)


def call(index: int, args: str, call_id: str | None = None, name: str | None = None) -> Any:
    delta: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id:
        delta |= {"id": call_id, "type": "function"}
        delta["function"]["name"] = name
    return {"tool_calls": [delta]}


def decode(out: bytes | None) -> list[dict[str, Any]]:
    if out is None:
        return []
    events = [e for e in out.split(b"\n\n") if e]
    return [orjson.loads(e.removeprefix(b"data: ")) for e in events if e != b"data: [DONE]"]


def run_legs(
    legs: list[list[Chunk]],
    plans: list[Plan],
    include_usage: bool = False,
    seams: Sequence[SeamRule | None] | None = None,
) -> Any:
    splicer = Splicer(RunAccumulator(), include_usage=include_usage)
    out: list[dict[str, Any]] = []
    for i, leg in enumerate(legs):
        if i:
            splicer.begin_leg(plans[i - 1], seams[i - 1] if seams else None)
        for c in leg:
            out += decode(splicer.feed(c))
        if i < len(legs) - 1:
            splicer.end_leg()
    return splicer, out


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_first_leg_chunks_that_need_no_change_pass_as_received() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=False)
    c = chunk({"content": "Hello"})
    assert splicer.feed(c) == b"data: " + c.data + b"\n\n"


def test_one_identity_one_role_and_text_continues_across_legs() -> None:
    leg0 = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hello, wor"})]
    leg1 = [
        chunk({"role": "assistant", "content": ""}, leg=1),
        chunk({"content": "ld! Bye."}, leg=1),
        chunk({}, "stop", leg=1),
    ]
    splicer, out = run_legs([leg0, leg1], [Plan.CONTINUE_TEXT])
    assert text_of(out) == "Hello, world! Bye."
    assert {(c["id"], c["model"], c["created"], c["system_fingerprint"]) for c in out} == {
        ("chatcmpl-leg0", "model-0", 100, "fp0")
    }
    assert [c["choices"][0]["delta"].get("role") for c in out].count("assistant") == 1
    assert [c["choices"][0]["finish_reason"] for c in out if c["choices"][0]["finish_reason"]] == [
        "stop"
    ]


def test_the_anchor_and_a_whole_restart_are_cut_exactly_at_the_seam() -> None:
    leg0 = [chunk({"content": "The quick brown fox "})]
    anchored = SeamRule("brown fox ", restart=True)
    echo = [chunk({"content": "brown fox jumps"}, leg=1), chunk({}, "stop", leg=1)]
    splicer, out = run_legs([leg0, echo], [Plan.CONTINUE_TEXT], seams=[anchored])
    assert text_of(out) == "The quick brown fox jumps"
    assert splicer.seam is not None and splicer.seam.trimmed == len("brown fox ")
    assert splicer.seam_outcomes() == ["echo"]

    restart = [
        chunk({"content": "The quick "}, leg=1),
        chunk({"content": "brown fox jumps"}, leg=1),
        chunk({}, "stop", leg=1),
    ]
    splicer, out = run_legs([leg0, restart], [Plan.CONTINUE_TEXT], seams=[anchored])
    assert text_of(out) == "The quick brown fox jumps"
    assert splicer.seam_outcomes() == ["restart"]


def test_a_literal_continuation_is_never_trimmed() -> None:
    # vllm / prefix: "papa" then a genuine "papa sierra" stays two words.
    leg0 = [chunk({"content": "alpha papa"})]
    leg1 = [chunk({"content": " papa sierra"}, leg=1), chunk({}, "stop", leg=1)]
    splicer, out = run_legs([leg0, leg1], [Plan.CONTINUE_TEXT], seams=[None])
    assert text_of(out) == "alpha papa papa sierra"
    assert splicer.trimmed == 0


def test_reasoning_from_a_later_leg_is_not_forwarded_again() -> None:
    leg0 = [chunk({"reasoning_content": "thinking"}), chunk({"content": "An"})]
    leg1 = [
        chunk({"reasoning_content": "thinking again"}, leg=1),
        chunk({"content": "swer"}, leg=1),
        chunk({}, "stop", leg=1),
    ]
    splicer, out = run_legs([leg0, leg1], [Plan.CONTINUE_TEXT])
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in out)
    assert (reasoning, text_of(out)) == ("thinking", "Answer")


def test_tool_calls_are_held_until_complete_then_released_whole() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=False)
    assert splicer.feed(chunk(call(0, '{"ci', "call_a", "weather"))) is None
    assert splicer.in_flight() == ["weather"]
    [released] = decode(splicer.feed(chunk(call(0, 'ty": "Zürich"}'))))
    assert released["choices"][0]["delta"]["tool_calls"] == [
        {
            "index": 0,
            "id": "call_a",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Zürich"}'},
        }
    ]
    assert splicer.in_flight() == [] and splicer.snapshot().completed_tool_calls == 1


def test_restarted_leg_calls_get_contiguous_indices_and_unique_ids() -> None:
    leg0 = [chunk(call(0, "{}", "call_x", "a")), chunk(call(1, '{"half', "call_y", "b"))]
    leg1 = [
        chunk(call(3, '{"whole": 1}', "call_x", "b"), leg=1),
        chunk({}, "tool_calls", leg=1),
    ]
    splicer, out = run_legs([leg0, leg1], [Plan.WHOLE_RESTART])
    calls = [
        tc for c in out if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert [c["index"] for c in calls] == [0, 1]
    assert len({c["id"] for c in calls}) == 2
    assert calls[1]["function"]["arguments"] == '{"whole": 1}'


def test_synthesized_finish_after_completed_calls() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=False)
    splicer.feed(chunk(call(0, "{}", "call_a", "f")))
    splicer.feed(chunk(call(1, '{"x"', "call_b", "g")))
    [end] = decode(splicer.synthesize_tool_use())
    assert end["choices"][0] == {
        "index": 0,
        "delta": {},
        "finish_reason": "tool_calls",
        "logprobs": None,
    }
    assert splicer.in_flight() == []


def test_usage_is_summed_over_legs_and_sent_once_when_asked() -> None:
    leg0 = [chunk({"content": "a"}, usage={"prompt_tokens": 5, "completion_tokens": 1})]
    leg1 = [
        chunk({"content": "bcd"}, leg=1),
        chunk({}, "stop", leg=1),
        chunk(leg=1, usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}),
    ]
    splicer, out = run_legs([leg0, leg1], [Plan.CONTINUE_TEXT], include_usage=True)
    assert all("usage" not in c for c in out)
    closing = splicer.close()
    assert closing.endswith(b"data: [DONE]\n\n")
    [usage_chunk] = decode(closing)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 10}
    assert Splicer(RunAccumulator(), include_usage=False).close() == b"data: [DONE]\n\n"


def test_text_held_at_the_seam_is_dropped_when_the_leg_breaks() -> None:
    # Never sent, so the next continuation (from the same text) says it again.
    splicer = Splicer(RunAccumulator(), include_usage=False)
    splicer.feed(chunk({"content": "abc def"}))
    splicer.begin_leg(Plan.CONTINUE_TEXT, SeamRule("def", restart=True))
    assert splicer.feed(chunk({"content": "d"}, leg=1)) is None  # could start the anchor
    splicer.end_leg()
    assert splicer.sent.text == "abc def"
    assert plan_recovery(splicer.snapshot()) is Plan.CONTINUE_TEXT
    splicer.begin_leg(Plan.CONTINUE_TEXT, SeamRule("def", restart=True))
    out = decode(splicer.feed(chunk({"content": "def ghi"}, leg=2)))
    assert text_of(out) == " ghi" and splicer.sent.text == "abc def ghi"


def test_a_finish_with_completed_calls_after_a_broken_leg_still_sends_usage() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=True)
    splicer.feed(chunk(call(0, "{}", "call_a", "f")))  # the leg broke before its usage
    out = decode(splicer.synthesize_tool_use() + splicer.close())
    assert [c["usage"] for c in out if c.get("usage")] == [
        {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    ]


def test_a_failed_run_ends_with_one_usage_chunk_before_its_error() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=True)
    splicer.feed(chunk({"content": "a"}, usage={"prompt_tokens": 5, "completion_tokens": 1}))
    [usage] = decode(splicer.usage_chunk())
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 1}
    # Nothing sent at all: there is no stream for a usage chunk to belong to.
    assert Splicer(RunAccumulator(), include_usage=True).usage_chunk() == b""


def test_logprobs_and_refusal_are_kept_in_stream_and_assembly() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=False, assemble=True)
    entry = {"token": "No", "logprob": -0.1, "bytes": [78, 111], "top_logprobs": []}
    logprobs = {"content": [entry]}
    choice = {"index": 0, "delta": {"refusal": "No"}, "logprobs": logprobs, "finish_reason": None}
    obj = {"id": "c", "choices": [choice]}
    splicer.begin_leg(Plan.WHOLE_RESTART)  # a later leg: the chunk is rebuilt, not passed
    [out] = decode(splicer.feed(Chunk(orjson.dumps(obj), obj)))
    assert out["choices"][0]["logprobs"] == logprobs
    completion = CHAT.assemble(splicer.sent)
    assert completion["choices"][0]["message"]["refusal"] == "No"
    assert completion["choices"][0]["logprobs"] == logprobs


def test_a_payload_received_over_several_data_lines_is_re_encoded_as_one() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=False)
    obj = {"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    out = splicer.feed(
        Chunk(b'{"id": "c",\n"choices": [{"index": 0, "delta": {"content": "x"}}]}', obj)
    )
    assert out is not None and out.count(b"\n") == 2 and out.endswith(b"\n\n")
    assert decode(out)[0]["choices"][0]["delta"] == {"content": "x"}


def test_trimmed_characters_add_up_over_several_seams() -> None:
    leg0 = [chunk({"content": "one two three "})]
    leg1 = [chunk({"content": "three four five "}, leg=1)]  # echoes "three "
    leg2 = [chunk({"content": "five six"}, leg=2), chunk({}, "stop", leg=2)]  # echoes "five "
    seams = [SeamRule("three ", restart=True), SeamRule("five ", restart=True)]
    splicer, out = run_legs(
        [leg0, leg1, leg2], [Plan.CONTINUE_TEXT, Plan.CONTINUE_TEXT], seams=seams
    )
    assert text_of(out) == "one two three four five six"
    assert splicer.trimmed == len("three ") + len("five ")


def test_a_stream_relays_logprobs_without_keeping_them() -> None:
    splicer = Splicer(RunAccumulator(), include_usage=False)
    logprobs = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
    choice = {"index": 0, "delta": {"content": "a"}, "logprobs": logprobs, "finish_reason": None}
    obj = {"id": "c", "choices": [choice]}
    splicer.begin_leg(Plan.WHOLE_RESTART)
    [out] = decode(splicer.feed(Chunk(orjson.dumps(obj), obj)))
    assert out["choices"][0]["logprobs"] == logprobs
    assert CHAT.assemble(splicer.sent)["choices"][0]["logprobs"] is None
